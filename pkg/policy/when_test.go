package policy_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
)

func TestParseWhenCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"volume>60":                         "volume > 60",
		"  mode in [a,b]  ":                 `mode in ["a", "b"]`,
		`mode !in ['x y', 2, true]`:         `mode !in ["x y", 2, true]`,
		`name ~ /^a\/b$/ && n.m <= -1.5e3`:  `name ~ /^a\/b$/ && n.m <= -1500`,
		`x != "say \"hi\""`:                 `x != "say \"hi\""`,
		"flag == false && other !~ /debug/": "flag == false && other !~ /debug/",
		"":                                  "",
	} {
		p, err := policy.ParseWhen(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if got := p.String(); got != want {
			t.Errorf("%q: canonical %q, want %q", in, got, want)
		}
	}
}

func TestParseWhenErrors(t *testing.T) {
	for _, in := range []string{
		"volume", "volume >", "> 5", "volume > loud", "volume = 5", "a == 1 &&", "a == 1 || b == 2",
		"a in 1", "a in [1", "a in []", "a ~ x", "a ~ /(/", "a == 'open", `a == "\n"`, "1a == 2",
		"a == 1e999", "a.b. == 1", strings.Repeat("a == 1 && ", 20) + "a == 1",
	} {
		if p, err := policy.ParseWhen(in); err == nil || !errors.Is(err, policy.ErrSyntax) {
			t.Errorf("%q: got %v, %v; want a syntax error", in, p, err)
		}
	}
}

func TestPredicateEval(t *testing.T) {
	args := policy.DecodeArgs([]byte(`{"volume":70,"mode":"night","on":true,"dev":{"name":"kitchen-1"},"tags":["a"]}`))
	for expr, want := range map[string]bool{
		"volume > 60":                   true,
		"volume >= 70 && volume <= 70":  true,
		"volume < 70":                   false,
		"volume == 70":                  true,
		"volume != 70":                  false,
		"volume == '70'":                false, // string vs number
		"volume != '70'":                false, // different types never compare
		"mode in [day, night]":          true,
		"mode !in [day, night]":         false,
		"mode !in [day]":                true,
		"mode in [1, 2]":                false,
		"on == true":                    true,
		"dev.name ~ /^kitchen-[0-9]+$/": true,
		"dev.name !~ /^kitchen/":        false,
		"dev.missing == 1":              false,
		"missing != 1":                  false,
		"tags == a":                     false, // arrays are not compared
		"volume > 60 && mode == day":    false,
		"volume ~ /7/":                  false, // regex needs a string
	} {
		p, err := policy.ParseWhen(expr)
		if err != nil {
			t.Fatalf("%q: %v", expr, err)
		}
		if got := p.Eval(args); got != want {
			t.Errorf("%q = %v, want %v", expr, got, want)
		}
	}
	var none *policy.Predicate
	if !none.Eval(nil) {
		t.Error("no predicate must hold")
	}
}

func FuzzParseWhen(f *testing.F) {
	for _, s := range []string{
		"volume>60", "mode in [a, 'b c', 3]", `name ~ /^x\/y/ && a.b != false`, "a !in [1]", "x !~ /a|b/",
		`s == "q\"uote"`, "n >= -1.5e-3", "a == b.c:d", "&&", "a ~ /", "a in [", "",
	} {
		f.Add(s, `{"volume":70,"mode":"a","name":"x/y","a":{"b":true},"n":0}`)
	}
	f.Fuzz(func(t *testing.T, expr, args string) {
		p, err := policy.ParseWhen(expr)
		if err != nil {
			if !errors.Is(err, policy.ErrSyntax) {
				t.Fatalf("%q: error %v is not ErrSyntax", expr, err)
			}
			return
		}
		canon := p.String()
		q, err := policy.ParseWhen(canon)
		if err != nil {
			t.Fatalf("%q: canonical form %q does not parse: %v", expr, canon, err)
		}
		if q.String() != canon {
			t.Fatalf("%q: canonical form is not stable: %q then %q", expr, canon, q.String())
		}
		a := policy.DecodeArgs([]byte(args))
		if p.Eval(a) != q.Eval(a) {
			t.Fatalf("%q and its canonical form %q disagree on %s", expr, canon, args)
		}
	})
}

// FuzzGlobMatch checks the glob matcher against the equivalent regular
// expression.
func FuzzGlobMatch(f *testing.F) {
	f.Add("xz-*", "xz-a1b2")
	f.Add("*.set_*", "self.audio.set_volume")
	f.Add("a?c*", "abc")
	f.Add("**a*", "bbb")
	f.Fuzz(func(t *testing.T, pattern, name string) {
		if len(pattern) > 64 || len(name) > 64 {
			return
		}
		var re strings.Builder
		re.WriteString(`^`)
		for _, c := range []byte(pattern) {
			switch c {
			case '*':
				re.WriteString(`(?s:.*)`)
			case '?':
				re.WriteString(`(?s:.)`)
			default:
				re.WriteString(regexp.QuoteMeta(string([]byte{c})))
			}
		}
		re.WriteString(`$`)
		r, err := regexp.Compile(re.String())
		if err != nil {
			return // not valid UTF-8 for the regexp; nothing to compare
		}
		if got, want := policy.GlobMatchForTest(pattern, name), r.MatchString(name); got != want && isASCII(pattern+name) {
			t.Fatalf("glob %q on %q = %v, want %v", pattern, name, got, want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
