package catalog

import (
	"encoding/json"
	"math"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsonobj"
)

// flatSchema is the shape of every schema XiaoZhi firmware emits: an object
// of boolean, integer, number or string properties with optional bounds and
// required names. Arguments that plainly satisfy such a schema are accepted
// without building a document for the full validator. The check is one-sided:
// it only ever says "valid"; anything else (a violation, or a value it cannot
// judge exactly, such as 1.0 or a 20-digit integer) goes to the full
// validator, which decides and explains.
type flatSchema struct {
	props    []flatProp
	required uint64 // bit i: props[i] is required
	closed   bool   // additionalProperties: false
}

type flatProp struct {
	name     string
	kind     string // "boolean", "integer", "number" or "string"
	min, max float64
	hasMin   bool
	hasMax   bool
}

// maxExact bounds the numbers the flat check compares: below 2^53 a float64
// holds every integer exactly.
const maxExact = 1 << 53

// newFlatSchema returns the flat form of a parsed schema document, or nil when
// the schema uses anything beyond the flat subset.
func newFlatSchema(doc any) *flatSchema {
	root, ok := doc.(map[string]any)
	if !ok {
		return nil
	}
	fs := &flatSchema{}
	var required []any
	for k, v := range root {
		switch k {
		case "type":
			if v != "object" {
				return nil
			}
		case "properties":
			props, ok := v.(map[string]any)
			if !ok || len(props) > 64 {
				return nil
			}
			for name, p := range props {
				fp, ok := newFlatProp(name, p)
				if !ok {
					return nil
				}
				fs.props = append(fs.props, fp)
			}
		case "required":
			if required, ok = v.([]any); !ok {
				return nil
			}
		case "additionalProperties":
			b, ok := v.(bool)
			if !ok {
				return nil
			}
			fs.closed = !b
		case "description", "title", "$schema", "$comment":
		default:
			return nil
		}
	}
	if root["type"] != "object" {
		return nil
	}
	for _, r := range required {
		name, ok := r.(string)
		if !ok {
			return nil
		}
		i := fs.index(name)
		if i < 0 {
			return nil
		}
		fs.required |= 1 << i
	}
	return fs
}

func newFlatProp(name string, v any) (flatProp, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return flatProp{}, false
	}
	p := flatProp{name: name}
	for k, v := range m {
		switch k {
		case "type":
			t, _ := v.(string)
			switch t {
			case "boolean", "integer", "number", "string":
				p.kind = t
			default:
				return flatProp{}, false
			}
		case "minimum", "maximum":
			n, ok := v.(json.Number)
			if !ok {
				return flatProp{}, false
			}
			f, err := n.Float64()
			if err != nil || math.Abs(f) >= maxExact {
				return flatProp{}, false
			}
			if k == "minimum" {
				p.min, p.hasMin = f, true
			} else {
				p.max, p.hasMax = f, true
			}
		case "description", "title", "default", "$comment":
		default:
			return flatProp{}, false
		}
	}
	if p.kind == "" || (p.hasMin || p.hasMax) && p.kind != "integer" && p.kind != "number" {
		return flatProp{}, false
	}
	return p, true
}

func (fs *flatSchema) index(name string) int {
	for i := range fs.props {
		if fs.props[i].name == name {
			return i
		}
	}
	return -1
}

// plainlyValid reports whether args (a JSON object; empty means {}) surely
// satisfy the schema. false means "ask the full validator".
func (fs *flatSchema) plainlyValid(args []byte) bool {
	if len(args) == 0 {
		return fs.required == 0
	}
	var seen uint64
	ok := true
	err := jsonobj.Walk(args, func(m jsonobj.Member) bool {
		i := -1
		for j := range fs.props {
			if m.Is(fs.props[j].name) {
				i = j
				break
			}
		}
		if i < 0 {
			ok = !fs.closed
			return ok
		}
		if seen&(1<<i) != 0 {
			ok = false // a repeated key: let the full validator judge
			return false
		}
		seen |= 1 << i
		ok = fs.props[i].plainlyValid(m.Value)
		return ok
	})
	return err == nil && ok && seen&fs.required == fs.required
}

func (p *flatProp) plainlyValid(v []byte) bool {
	switch p.kind {
	case "boolean":
		return jsonobj.IsBool(v)
	case "string":
		return jsonobj.IsString(v)
	}
	// integer or number: only plain integer literals short enough to be exact
	if len(v) == 0 || len(v) > 16 {
		return false
	}
	neg := v[0] == '-'
	if neg {
		v = v[1:]
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	if len(v) == 0 || n >= maxExact {
		return false
	}
	f := float64(n)
	if neg {
		f = -f
	}
	return (!p.hasMin || f >= p.min) && (!p.hasMax || f <= p.max)
}
