package xzsim

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Property kinds a firmware tool parameter can have.
const (
	kindBoolean = "boolean"
	kindInteger = "integer"
	kindString  = "string"
)

// property is one tool parameter. Like the firmware, a property without a
// default is required, and integers may carry an inclusive range.
type property struct {
	name       string
	kind       string
	hasDefault bool
	defBool    bool
	defInt     int
	defString  string
	hasRange   bool
	min, max   int
}

// toolResult is what a tool returns; the firmware turns bool and int into
// text ("true", "42"), strings stay as they are and JSON is stringified.
type toolResult any

// jsonText marks a tool result that is already JSON text.
type jsonText string

// args holds the validated arguments of one call, keyed by property name.
type args map[string]any

func (a args) int(name string) int       { v, _ := a[name].(int); return v }
func (a args) string(name string) string { v, _ := a[name].(string); return v }

type tool struct {
	name        string
	description string
	props       []property
	userOnly    bool
	run         func(d *Device, a args) (toolResult, error)
	schema      []byte // the catalog entry, rendered once
}

// render builds the catalog entry in the firmware's shape: name, description,
// inputSchema {type, properties, required?}, and annotations.audience ["user"]
// for user-only tools.
func (t *tool) render() {
	type propJSON struct {
		Type    string `json:"type"`
		Default any    `json:"default,omitempty"`
		Minimum *int   `json:"minimum,omitempty"`
		Maximum *int   `json:"maximum,omitempty"`
	}
	props := make(map[string]propJSON, len(t.props)) // encoding/json sorts map keys: stable output
	required := []string{}
	for _, p := range t.props {
		pj := propJSON{Type: p.kind}
		if p.hasDefault {
			switch p.kind {
			case kindBoolean:
				pj.Default = p.defBool
			case kindInteger:
				pj.Default = p.defInt
			case kindString:
				pj.Default = p.defString
			}
		} else {
			required = append(required, p.name)
		}
		if p.hasRange {
			lo, hi := p.min, p.max
			pj.Minimum, pj.Maximum = &lo, &hi
		}
		props[p.name] = pj
	}
	schema := struct {
		Type       string              `json:"type"`
		Properties map[string]propJSON `json:"properties"`
		Required   []string            `json:"required,omitempty"`
	}{"object", props, required}
	entry := struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		InputSchema any    `json:"inputSchema"`
		Annotations any    `json:"annotations,omitempty"`
	}{Name: t.name, Description: t.description, InputSchema: schema}
	if t.userOnly {
		entry.Annotations = map[string][]string{"audience": {"user"}}
	}
	b, err := json.Marshal(entry)
	if err != nil {
		panic(fmt.Sprintf("xzsim: tool %s does not render: %v", t.name, err)) // static definitions: a bug
	}
	t.schema = b
}

// bind checks raw call arguments against the tool's properties the way the
// firmware does: properties in order, the first problem wins, extra
// arguments are ignored, integers are truncated then range-checked.
func (t *tool) bind(raw map[string]json.RawMessage) (args, error) {
	out := make(args, len(t.props))
	for _, p := range t.props {
		v, present := raw[p.name]
		var ok bool
		if present {
			switch p.kind {
			case kindBoolean:
				var b bool
				if ok = json.Unmarshal(v, &b) == nil && (string(v) == "true" || string(v) == "false"); ok {
					out[p.name] = b
				}
			case kindInteger:
				var f float64
				if ok = len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') && json.Unmarshal(v, &f) == nil; ok {
					n := int(f)
					if p.hasRange && n < p.min {
						return nil, deviceError(fmt.Sprintf("Value is below minimum allowed: %d", p.min))
					}
					if p.hasRange && n > p.max {
						return nil, deviceError(fmt.Sprintf("Value exceeds maximum allowed: %d", p.max))
					}
					out[p.name] = n
				}
			case kindString:
				var s string
				if ok = len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil; ok {
					out[p.name] = s
				}
			}
		}
		if ok {
			continue
		}
		if !p.hasDefault {
			return nil, deviceError("Missing valid argument: " + p.name)
		}
		switch p.kind {
		case kindBoolean:
			out[p.name] = p.defBool
		case kindInteger:
			out[p.name] = p.defInt
		case kindString:
			out[p.name] = p.defString
		}
	}
	return out, nil
}

// deviceError is an error message exactly as the firmware words it.
type deviceError string

func (e deviceError) Error() string { return string(e) }

// resultText renders a tool result as the text of its content item.
func resultText(r toolResult) string {
	switch v := r.(type) {
	case bool:
		return strconv.FormatBool(v)
	case int:
		return strconv.Itoa(v)
	case string:
		return v
	case jsonText:
		return string(v)
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

func intProp(name string, lo, hi int) property {
	return property{name: name, kind: kindInteger, hasRange: true, min: lo, max: hi}
}

func stringProp(name string) property { return property{name: name, kind: kindString} }

// builtinTools returns the common tools of a display board with a speaker,
// then the user-only tools, in the order the firmware lists them.
func builtinTools() []*tool {
	return []*tool{
		{
			name: "self.get_device_status",
			description: "Returns the live state of the device: speaker volume, screen brightness and theme, " +
				"battery, network and chip. Call it to answer questions about the device and before changing a setting.",
			run: func(d *Device, _ args) (toolResult, error) { return d.statusJSON(), nil },
		},
		{
			name:        "self.audio_speaker.set_volume",
			description: "Sets the speaker volume. Read the current volume with self.get_device_status first when the change is relative.",
			props:       []property{intProp("volume", 0, 100)},
			run: func(d *Device, a args) (toolResult, error) {
				d.mu.Lock()
				d.volume = a.int("volume")
				d.mu.Unlock()
				return true, nil
			},
		},
		{
			name:        "self.screen.set_brightness",
			description: "Sets the brightness of the screen backlight.",
			props:       []property{intProp("brightness", 0, 100)},
			run: func(d *Device, a args) (toolResult, error) {
				d.mu.Lock()
				d.brightness = a.int("brightness")
				d.mu.Unlock()
				return true, nil
			},
		},
		{
			name:        "self.screen.set_theme",
			description: "Sets the theme of the screen; the theme is `light` or `dark`.",
			props:       []property{stringProp("theme")},
			run: func(d *Device, a args) (toolResult, error) {
				theme := a.string("theme")
				if theme != "light" && theme != "dark" {
					return false, nil
				}
				d.mu.Lock()
				d.theme = theme
				d.mu.Unlock()
				return true, nil
			},
		},
		{
			name:        "self.get_system_info",
			description: "Returns the system information of the device (chip, firmware, memory).",
			userOnly:    true,
			run: func(d *Device, _ args) (toolResult, error) {
				b, _ := json.Marshal(map[string]any{
					"chip_model_name": "esp32s3", "mac_address": d.cfg.MAC, "uuid": d.cfg.ClientID,
					"application": map[string]string{"name": "xiaozhi", "version": d.cfg.FirmwareVersion},
					"board":       map[string]string{"type": d.cfg.BoardName},
				})
				return jsonText(b), nil
			},
		},
		{
			name:        "self.reboot",
			description: "Reboots the device.",
			userOnly:    true,
			run:         func(*Device, args) (toolResult, error) { return true, nil },
		},
		{
			name:        "self.upgrade_firmware",
			description: "Downloads firmware from the given URL and installs it.",
			props:       []property{stringProp("url")},
			userOnly:    true,
			run:         func(*Device, args) (toolResult, error) { return true, nil },
		},
		{
			name:        "self.screen.get_info",
			description: "Returns the size and colour depth of the screen.",
			userOnly:    true,
			run: func(*Device, args) (toolResult, error) {
				return jsonText(`{"width":240,"height":240,"monochrome":false}`), nil
			},
		},
		{
			name:        "self.screen.snapshot",
			description: "Takes a JPEG snapshot of the screen and uploads it to the given URL.",
			props: []property{stringProp("url"),
				{name: "quality", kind: kindInteger, hasDefault: true, defInt: 80, hasRange: true, min: 1, max: 100}},
			userOnly: true,
			run:      func(*Device, args) (toolResult, error) { return true, nil },
		},
		{
			name:        "self.screen.preview_image",
			description: "Shows the image at the given URL on the screen.",
			props:       []property{stringProp("url")},
			userOnly:    true,
			run:         func(*Device, args) (toolResult, error) { return true, nil },
		},
		{
			name:        "self.assets.set_download_url",
			description: "Sets the URL the device downloads its assets from.",
			props:       []property{stringProp("url")},
			userOnly:    true,
			run:         func(*Device, args) (toolResult, error) { return true, nil },
		},
	}
}

// extraTool is a board-style tool that only makes the catalog longer; it
// stores its value on the device (see Device.ExtraValue).
func extraTool(i int) *tool {
	return &tool{
		name: fmt.Sprintf("self.sim.extra_%04d", i),
		description: fmt.Sprintf("Simulated board tool number %d. It stores the given value on the simulated device "+
			"and returns it; it exists so that the tool catalog spans several tools/list pages.", i),
		props: []property{intProp("value", 0, 1000)},
		run: func(d *Device, a args) (toolResult, error) {
			v := a.int("value")
			d.mu.Lock()
			if d.extra == nil {
				d.extra = make(map[int]int)
			}
			d.extra[i] = v
			d.mu.Unlock()
			return v, nil
		},
	}
}

// catalog is the ordered tool list of one device model; it is immutable and
// shared by every device with the same number of extra tools.
type catalog struct {
	tools  []*tool
	byName map[string]*tool
}

func newCatalog(extra int) *catalog {
	c := &catalog{tools: builtinTools(), byName: make(map[string]*tool)}
	for i := 1; i <= extra; i++ {
		c.tools = append(c.tools, extraTool(i))
	}
	for _, t := range c.tools {
		t.render()
		c.byName[t.name] = t
	}
	return c
}
