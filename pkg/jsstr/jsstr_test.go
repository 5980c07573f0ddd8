package jsstr

import "testing"

func TestTrimMatchesJavaScript(t *testing.T) {
	for in, want := range map[string]string{
		" a\t":          "a",
		"\ufeffb\u3000": "b",       // BOM and ideographic space are JS white space
		"\u0085c":       "\u0085c", // NEL is not
		"\u2000d\u200a": "d",
		"\u2028e\u2029": "e",
		"\u200bf":       "\u200bf", // zero-width space is not
		"":              "",
	} {
		if got := Trim(in); got != want {
			t.Errorf("Trim(%q) = %q, want %q", in, got, want)
		}
	}
}
