package nodes

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestToolsDiff(t *testing.T) {
	old := json.RawMessage(`[{"name":"a","inputSchema":{"type":"object"}},{"name":"b"},{"name":"c","description":"x"},{"nameless":1},7]`)
	cur := json.RawMessage(`[{"name":"a", "inputSchema": {"type":"object"}},{"name":"c","description":"y"},{"name":"d"}]`)
	added, removed, changed := toolsDiff(old, cur)
	if !reflect.DeepEqual(added, []string{"d"}) || !reflect.DeepEqual(removed, []string{"b"}) || !reflect.DeepEqual(changed, []string{"c"}) {
		t.Fatalf("added %v removed %v changed %v", added, removed, changed)
	}
	if a, r, c := toolsDiff(nil, json.RawMessage(`not json`)); a != nil || r != nil || c != nil {
		t.Fatalf("garbage: %v %v %v", a, r, c)
	}
}
