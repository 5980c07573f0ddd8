package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

const tools = `[
 {"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},
 {"name":"self.light.set_rgb","inputSchema":{"type":"object","properties":{"r":{"type":"integer"},"g":{"type":"integer"}},"required":["r","g"],"additionalProperties":false}},
 {"name":"self.get_device_status","inputSchema":{"type":"object","properties":{}}},
 {"name":"self.no_schema"},
 {"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object"}},
 {"description":"nameless"}
]`

func TestCatalogIndex(t *testing.T) {
	c := New(json.RawMessage(tools), NewSchemas(0))
	if err := c.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"self.audio_speaker.set_volume", "self.get_device_status", "self.light.set_rgb", "self.no_schema"}
	if got := c.Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("names = %v, want %v", got, want)
	}
	if _, ok := c.Tool("self.nope"); ok {
		t.Error("found a tool that is not listed")
	}
	// The first listing of a duplicated name wins: its schema still applies.
	tool, _ := c.Tool("self.audio_speaker.set_volume")
	if err := tool.Validate(json.RawMessage(`{"volume":101}`)); err == nil {
		t.Error("duplicate listing replaced the first schema")
	}

	for _, raw := range []string{``, `null`, `[]`} {
		if c := New(json.RawMessage(raw), NewSchemas(0)); c.Len() != 0 || c.Err() != nil {
			t.Errorf("catalog %q: len %d err %v", raw, c.Len(), c.Err())
		}
	}
	if c := New(json.RawMessage(`{"tools":[]}`), NewSchemas(0)); c.Err() == nil || c.Len() != 0 {
		t.Error("a catalog that is not an array was accepted")
	}
}

func TestValidateNamesArgumentAndRule(t *testing.T) {
	c := New(json.RawMessage(tools), NewSchemas(0))
	tests := []struct {
		tool, args, want string // want "" means valid
	}{
		{"self.audio_speaker.set_volume", `{"volume":50}`, ""},
		{"self.audio_speaker.set_volume", `{"volume":0,"extra":true}`, ""},
		{"self.audio_speaker.set_volume", `{"volume":150}`, `invalid arguments for self.audio_speaker.set_volume: argument "volume": maximum: got 150, want 100`},
		{"self.audio_speaker.set_volume", `{"volume":"50"}`, `argument "volume": got string, want integer`},
		{"self.audio_speaker.set_volume", ``, `missing argument "volume"`},
		{"self.light.set_rgb", `{}`, `missing arguments "r", "g"`},
		{"self.light.set_rgb", `{"r":1,"g":2,"b":3}`, `unexpected argument(s) "b"`},
		{"self.light.set_rgb", `{"r":"x","g":"y"}`, `argument "g": got string, want integer; argument "r": got string, want integer`},
		{"self.get_device_status", `{"anything":[1,2]}`, ""},
		{"self.no_schema", `{"anything":1}`, ""},
		{"self.audio_speaker.set_volume", `{"volume":`, "arguments are not valid JSON"},
	}
	for _, tt := range tests {
		tool, ok := c.Tool(tt.tool)
		if !ok {
			t.Fatalf("no tool %s", tt.tool)
		}
		err := tool.Validate(json.RawMessage(tt.args))
		if tt.want == "" {
			if err != nil {
				t.Errorf("%s %s: %v", tt.tool, tt.args, err)
			}
			continue
		}
		var ae *ArgumentError
		if !errors.As(err, &ae) {
			t.Errorf("%s %s: error %v, want an ArgumentError", tt.tool, tt.args, err)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s %s:\n got %q\nwant %q", tt.tool, tt.args, err, tt.want)
		}
	}
}

// A device's schema must not make the shim read files: a $ref to a local
// file is refused, and the tool is left to the device to check.
func TestSchemaCannotReadFiles(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"file://" + secret, secret, "http://127.0.0.1:1/schema.json"} {
		raw := `[{"name":"t","inputSchema":{"type":"object","properties":{"a":{"$ref":` + quote(ref) + `}}}}]`
		c := New(json.RawMessage(raw), NewSchemas(0))
		tool, _ := c.Tool("t")
		// Were the file loaded, {"a":1} would fail as "want string".
		if err := tool.Validate(json.RawMessage(`{"a":1}`)); err != nil {
			t.Errorf("$ref %s was followed: %v", ref, err)
		}
		if tool.compiled.schema != nil {
			t.Errorf("schema with $ref %s compiled", ref)
		}
	}
}

func TestDraft07SchemaCompiles(t *testing.T) {
	raw := `[{"name":"t","inputSchema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"n":{"type":"integer","maximum":3}}}}]`
	tool, _ := New(json.RawMessage(raw), NewSchemas(0)).Tool("t")
	if err := tool.Validate(json.RawMessage(`{"n":4}`)); err == nil {
		t.Error("draft-07 schema not enforced")
	}
}

func TestSchemasSharedAcrossCatalogs(t *testing.T) {
	s := NewSchemas(0)
	a, _ := New(json.RawMessage(tools), s).Tool("self.audio_speaker.set_volume")
	b, _ := New(json.RawMessage(tools), s).Tool("self.audio_speaker.set_volume")
	_ = a.Validate(nil)
	_ = b.Validate(nil)
	if a.compiled.schema == nil || a.compiled != b.compiled {
		t.Error("identical schemas were compiled twice")
	}
	small := NewSchemas(1)
	for _, name := range []string{"self.audio_speaker.set_volume", "self.light.set_rgb"} {
		tool, _ := New(json.RawMessage(tools), small).Tool(name)
		_ = tool.Validate(nil)
	}
	if len(small.compiled) != 1 {
		t.Errorf("cache holds %d schemas, cap is 1", len(small.compiled))
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func BenchmarkValidate(b *testing.B) {
	tool, _ := New(json.RawMessage(tools), NewSchemas(0)).Tool("self.audio_speaker.set_volume")
	args := json.RawMessage(`{"volume":50}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := tool.Validate(args); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFlatSchemaRecognised(t *testing.T) {
	tests := []struct {
		schema string
		flat   bool
	}{
		{`{"type":"object","properties":{}}`, true},
		{`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`, true},
		{`{"type":"object","properties":{"on":{"type":"boolean","default":true},"s":{"type":"string","description":"d"}},"additionalProperties":false}`, true},
		{`{"type":"object","properties":{"s":{"type":"string","maxLength":3}}}`, false},
		{`{"type":"object","properties":{"s":{"type":"string","minimum":3}}}`, false},
		{`{"type":"object","properties":{"a":{"type":"array"}}}`, false},
		{`{"type":"object","properties":{"a":{"enum":[1,2]}}}`, false},
		{`{"type":"object","required":["ghost"]}`, false},
		{`{"properties":{}}`, false},
		{`{"type":"object","properties":{"n":{"type":"integer","maximum":1e300}}}`, false},
		{`{"type":"object","allOf":[{}]}`, false},
	}
	for _, tt := range tests {
		c := compileSchema([]byte(tt.schema))
		if c.schema == nil {
			t.Fatalf("%s does not compile", tt.schema)
		}
		if (c.flat != nil) != tt.flat {
			t.Errorf("%s: flat = %v, want %v", tt.schema, c.flat != nil, tt.flat)
		}
	}
}

func TestValidateFlatPathDoesNotAllocate(t *testing.T) {
	tool, _ := New(json.RawMessage(tools), NewSchemas(0)).Tool("self.audio_speaker.set_volume")
	args := json.RawMessage(`{"volume":50}`)
	if allocs := testing.AllocsPerRun(100, func() { _ = tool.Validate(args) }); allocs != 0 {
		t.Errorf("valid arguments cost %.0f allocations", allocs)
	}
}

// FuzzFlatAgrees checks the flat check against the full validator: whatever
// the flat check calls valid, the full validator must accept too.
func FuzzFlatAgrees(f *testing.F) {
	schemas := []string{
		`{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}`,
		`{"type":"object","properties":{"r":{"type":"integer","minimum":-5},"on":{"type":"boolean"},"s":{"type":"string"},"x":{"type":"number","maximum":2.5}},"required":["r","s"],"additionalProperties":false}`,
		`{"type":"object","properties":{}}`,
	}
	var cs []*compiled
	for _, s := range schemas {
		c := compileSchema([]byte(s))
		if c.flat == nil {
			f.Fatalf("%s is not flat", s)
		}
		cs = append(cs, c)
	}
	for _, a := range []string{`{"volume":50}`, `{"volume":100}`, `{"volume":101}`, `{"volume":-0}`, `{"volume":1.0}`, `{"volume":1e2}`,
		`{"r":-5,"s":"x","on":true,"x":2}`, `{"r":-6,"s":""}`, `{"r":1,"s":"a","z":1}`, `{"r":1,"s":"a","r":2}`, `{"x":3}`, `{}`,
		`{"volume":9007199254740993}`, `{"vol\u0075me":5}`} {
		f.Add(uint8(0), []byte(a))
		f.Add(uint8(1), []byte(a))
	}
	f.Fuzz(func(t *testing.T, which uint8, args []byte) {
		c := cs[int(which)%len(cs)]
		if !c.flat.plainlyValid(args) {
			return
		}
		inst := any(map[string]any{})
		if len(args) > 0 {
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
			if err != nil {
				t.Fatalf("flat check accepted invalid JSON %q", args)
			}
			inst = v
		}
		if err := c.schema.Validate(inst); err != nil {
			t.Fatalf("flat check accepted %q, full validator: %v", args, err)
		}
	})
}
