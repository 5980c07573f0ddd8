// Package k8sschema turns the Kubernetes OpenAPI v2 document (api/openapi-spec/swagger.json in
// the k8s.io/kubernetes module) into one self-contained, strict JSON schema per API kind, laid
// out the way kubeconform's -schema-location template expects. Strict means an unknown field
// anywhere in an object fails validation, which catches misspelled keys in chart templates.
package k8sschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// quantityDef is the definition of resource quantities ("500m", "1Gi", or a bare number).
const quantityDef = "io.k8s.apimachinery.pkg.api.resource.Quantity"

// gvkExtension lists the group/version/kind a definition is served as.
const gvkExtension = "x-kubernetes-group-version-kind"

// validToken is what a group, version or kind may contain; it also keeps file names inside
// the output directory.
var validToken = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.-]*$`)

// Schema is one generated file: File is its name inside the output directory
// (kind[-group]-version.json, lower case), Body its JSON.
type Schema struct {
	File string
	Body []byte
}

type node = map[string]any

// Generate reads a swagger.json document and returns one schema per served kind, sorted by
// file name. A definition that is not a JSON object is an error; a kind with a malformed
// group/version/kind entry is an error too, so a truncated input never yields a partial set
// silently.
func Generate(swagger []byte) ([]Schema, error) {
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(swagger, &doc); err != nil {
		return nil, fmt.Errorf("parse swagger document: %w", err)
	}
	if len(doc.Definitions) == 0 {
		return nil, errors.New("swagger document has no definitions")
	}
	defs := make(map[string]node, len(doc.Definitions))
	for name, d := range doc.Definitions {
		def, ok := d.(node)
		if !ok {
			return nil, fmt.Errorf("definition %q is not an object", name)
		}
		tighten(def)
		defs[name] = def
	}
	// Quantities are strings in YAML but numbers are accepted too (cpu: 1).
	if _, ok := defs[quantityDef]; ok {
		defs[quantityDef] = node{"oneOf": []any{node{"type": "string"}, node{"type": "number"}}}
	}

	names := make([]string, 0, len(defs))
	for name := range defs {
		names = append(names, name)
	}
	sort.Strings(names)

	byFile := map[string]Schema{}
	for _, name := range names {
		kinds, err := servedKinds(name, defs[name])
		if err != nil {
			return nil, err
		}
		for _, file := range kinds {
			if _, dup := byFile[file]; dup {
				continue // the first definition in name order wins, so output is stable
			}
			closure := map[string]any{}
			if err := addWithRefs(name, defs, closure); err != nil {
				return nil, err
			}
			body, err := json.Marshal(node{
				"$schema":     "http://json-schema.org/draft-07/schema#",
				"$ref":        "#/definitions/" + name,
				"definitions": closure,
			})
			if err != nil {
				return nil, fmt.Errorf("encode schema for %s: %w", name, err)
			}
			byFile[file] = Schema{File: file, Body: body}
		}
	}
	if len(byFile) == 0 {
		return nil, errors.New("no definition carries " + gvkExtension)
	}
	out := make([]Schema, 0, len(byFile))
	for _, s := range byFile {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, nil
}

// servedKinds returns the file names of the kinds a definition is served as:
// "deployment-apps-v1.json" for apps/v1, "service-v1.json" for the core group. kubeconform
// names the group by its first DNS label (networking.k8s.io -> networking).
func servedKinds(name string, def node) ([]string, error) {
	raw, ok := def[gvkExtension]
	if !ok {
		return nil, nil
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("definition %q: %s is not a list", name, gvkExtension)
	}
	var files []string
	for _, entry := range list {
		gvk, ok := entry.(node)
		if !ok {
			return nil, fmt.Errorf("definition %q: %s entry is not an object", name, gvkExtension)
		}
		group, okG := gvk["group"].(string)
		version, okV := gvk["version"].(string)
		kind, okK := gvk["kind"].(string)
		if !okG || !okV || !okK || !validToken.MatchString(version) || !validToken.MatchString(kind) ||
			(group != "" && !validToken.MatchString(group)) {
			return nil, fmt.Errorf("definition %q: %s entry needs a group, version and kind made of letters, digits, '.' and '-'", name, gvkExtension)
		}
		file := strings.ToLower(kind)
		if group != "" {
			file += "-" + strings.ToLower(strings.Split(group, ".")[0])
		}
		files = append(files, file+"-"+strings.ToLower(version)+".json")
	}
	return files, nil
}

// addWithRefs copies a definition and everything it references into closure, so each
// schema file stands alone.
func addWithRefs(name string, defs map[string]node, closure map[string]any) error {
	if _, done := closure[name]; done {
		return nil
	}
	def, ok := defs[name]
	if !ok {
		return fmt.Errorf("reference to missing definition %q", name)
	}
	closure[name] = def
	var err error
	eachRef(def, func(ref string) {
		if err == nil {
			err = addWithRefs(ref, defs, closure)
		}
	})
	return err
}

// eachRef calls f with the definition name of every local $ref under v.
func eachRef(v any, f func(string)) {
	switch t := v.(type) {
	case node:
		if ref, ok := t["$ref"].(string); ok {
			if name, local := strings.CutPrefix(ref, "#/definitions/"); local {
				f(name)
			}
		}
		for _, child := range t {
			eachRef(child, f)
		}
	case []any:
		for _, child := range t {
			eachRef(child, f)
		}
	}
}

// tighten rewrites a schema in place: objects with declared properties reject unknown ones,
// every typed value may also be null (YAML "key:" with no value decodes to null and the API
// server accepts it), and int-or-string fields accept either.
func tighten(v any) {
	switch t := v.(type) {
	case node:
		for _, child := range t {
			tighten(child)
		}
		if t["format"] == "int-or-string" {
			delete(t, "format")
			delete(t, "type")
			t["oneOf"] = []any{node{"type": "string"}, node{"type": "integer"}}
			return
		}
		if _, hasProps := t["properties"].(node); hasProps {
			if _, set := t["additionalProperties"]; !set {
				t["additionalProperties"] = false
			}
		}
		if ty, ok := t["type"].(string); ok {
			t["type"] = []any{ty, "null"}
		}
	case []any:
		for _, child := range t {
			tighten(child)
		}
	}
}
