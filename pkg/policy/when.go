package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// A predicate (a rule's --when) is a conjunction of conditions on a tool
// call's named arguments:
//
//	volume > 60
//	mode in [night, "do not disturb"] && level >= 2
//	name ~ /^kitchen-/ && speaker.muted == false
//
// Grammar:
//
//	expr  = cond { "&&" cond }
//	cond  = path op value | path ["!"] "in" "[" value { "," value } "]" | path ("~" | "!~") regex
//	path  = ident { "." ident }           ident = [A-Za-z_][A-Za-z0-9_-]*
//	op    = "==" | "!=" | "<" | "<=" | ">" | ">="
//	value = number | "string" | 'string' | true | false | word
//	regex = /RE2 syntax, "\/" for a slash/
//
// A bare word (mode in [a, b]) is a string. Ordering operators need a
// number. A condition is false when the argument is absent or of another
// JSON type than the value, so "volume > 60" is false for {"volume":"loud"}.

// Limits that keep parsing and evaluation cheap for any input.
const (
	maxWhenLen    = 1024
	maxConditions = 16
	maxListItems  = 64
	maxRegexLen   = 256
)

// ErrSyntax is wrapped by every predicate parse error.
var ErrSyntax = errors.New("predicate syntax")

// Predicate is a parsed --when expression.
type Predicate struct {
	conds []condition
}

type opKind int

const (
	opEq opKind = iota
	opNe
	opLt
	opLe
	opGt
	opGe
	opIn
	opNotIn
	opMatch
	opNotMatch
)

var opText = [...]string{"==", "!=", "<", "<=", ">", ">=", "in", "!in", "~", "!~"}

type valueKind int

const (
	vNumber valueKind = iota
	vString
	vBool
)

type value struct {
	kind valueKind
	num  float64
	str  string
	b    bool
}

type condition struct {
	path   []string
	op     opKind
	vals   []value // one for comparisons, the list for in
	re     *regexp.Regexp
	reText string
}

// ParseWhen parses a predicate. An empty string is no predicate (nil).
func ParseWhen(s string) (*Predicate, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	if len(s) > maxWhenLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrSyntax, maxWhenLen)
	}
	p := &parser{s: s}
	var pred Predicate
	for {
		c, err := p.condition()
		if err != nil {
			return nil, err
		}
		pred.conds = append(pred.conds, c)
		if len(pred.conds) > maxConditions {
			return nil, fmt.Errorf("%w: more than %d conditions", ErrSyntax, maxConditions)
		}
		p.space()
		if p.eof() {
			return &pred, nil
		}
		if !p.lit("&&") {
			return nil, p.errorf("expected && or the end")
		}
	}
}

type parser struct {
	s   string
	pos int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrSyntax, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) eof() bool { return p.pos >= len(p.s) }

func (p *parser) space() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

// lit consumes t if it comes next.
func (p *parser) lit(t string) bool {
	if strings.HasPrefix(p.s[p.pos:], t) {
		p.pos += len(t)
		return true
	}
	return false
}

func isIdentStart(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' }
func isIdentChar(c byte) bool  { return isIdentStart(c) || c >= '0' && c <= '9' || c == '-' }

func (p *parser) ident() (string, bool) {
	start := p.pos
	if p.eof() || !isIdentStart(p.s[p.pos]) {
		return "", false
	}
	for p.pos < len(p.s) && isIdentChar(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos], true
}

func (p *parser) condition() (condition, error) {
	var c condition
	p.space()
	for {
		id, ok := p.ident()
		if !ok {
			return c, p.errorf("expected an argument name")
		}
		c.path = append(c.path, id)
		if !p.lit(".") {
			break
		}
	}
	p.space()
	switch {
	case p.lit("=="):
		c.op = opEq
	case p.lit("!="):
		c.op = opNe
	case p.lit("<="):
		c.op = opLe
	case p.lit(">="):
		c.op = opGe
	case p.lit("<"):
		c.op = opLt
	case p.lit(">"):
		c.op = opGt
	case p.lit("!~"):
		c.op = opNotMatch
	case p.lit("~"):
		c.op = opMatch
	case p.lit("!in"):
		c.op = opNotIn
	case p.keyword("in"):
		c.op = opIn
	default:
		return c, p.errorf("expected an operator (== != < <= > >= in !in ~ !~)")
	}
	p.space()
	switch c.op {
	case opMatch, opNotMatch:
		text, err := p.regex()
		if err != nil {
			return c, err
		}
		re, err := regexp.Compile(text)
		if err != nil {
			return c, p.errorf("bad regular expression: %v", err)
		}
		c.re, c.reText = re, text
	case opIn, opNotIn:
		if !p.lit("[") {
			return c, p.errorf("expected [ after in")
		}
		for {
			p.space()
			v, err := p.value()
			if err != nil {
				return c, err
			}
			c.vals = append(c.vals, v)
			if len(c.vals) > maxListItems {
				return c, p.errorf("more than %d list items", maxListItems)
			}
			p.space()
			if p.lit("]") {
				break
			}
			if !p.lit(",") {
				return c, p.errorf("expected , or ]")
			}
		}
	default:
		v, err := p.value()
		if err != nil {
			return c, err
		}
		if c.op >= opLt && c.op <= opGe && v.kind != vNumber {
			return c, p.errorf("%s needs a number", opText[c.op])
		}
		c.vals = []value{v}
	}
	return c, nil
}

// keyword consumes w if it comes next as a whole word.
func (p *parser) keyword(w string) bool {
	if !strings.HasPrefix(p.s[p.pos:], w) {
		return false
	}
	end := p.pos + len(w)
	if end < len(p.s) && isIdentChar(p.s[end]) {
		return false
	}
	p.pos = end
	return true
}

func (p *parser) regex() (string, error) {
	if !p.lit("/") {
		return "", p.errorf("expected /regex/")
	}
	var b strings.Builder
	for {
		if p.eof() {
			return "", p.errorf("unterminated regular expression")
		}
		c := p.s[p.pos]
		p.pos++
		switch {
		case c == '/':
			if b.Len() > maxRegexLen {
				return "", p.errorf("regular expression longer than %d bytes", maxRegexLen)
			}
			return b.String(), nil
		case c == '\\' && !p.eof() && p.s[p.pos] == '/':
			b.WriteByte('/')
			p.pos++
		default:
			b.WriteByte(c)
		}
	}
}

func (p *parser) value() (value, error) {
	if p.eof() {
		return value{}, p.errorf("expected a value")
	}
	switch c := p.s[p.pos]; {
	case c == '"' || c == '\'':
		return p.quoted(c)
	case c == '-' || c == '+' || c == '.' || c >= '0' && c <= '9':
		start := p.pos
		for p.pos < len(p.s) && strings.IndexByte("+-.0123456789eE", p.s[p.pos]) >= 0 {
			p.pos++
		}
		f, err := strconv.ParseFloat(p.s[start:p.pos], 64)
		if err != nil || f != f || f > 1e308 || f < -1e308 {
			return value{}, p.errorf("bad number %q", p.s[start:p.pos])
		}
		return value{kind: vNumber, num: f}, nil
	case isIdentStart(c):
		start := p.pos
		for p.pos < len(p.s) && (isIdentChar(p.s[p.pos]) || p.s[p.pos] == '.' || p.s[p.pos] == ':') {
			p.pos++
		}
		switch w := p.s[start:p.pos]; w {
		case "true":
			return value{kind: vBool, b: true}, nil
		case "false":
			return value{kind: vBool}, nil
		default:
			return value{kind: vString, str: w}, nil
		}
	default:
		return value{}, p.errorf("expected a value")
	}
}

func (p *parser) quoted(q byte) (value, error) {
	p.pos++
	var b strings.Builder
	for {
		if p.eof() {
			return value{}, p.errorf("unterminated string")
		}
		c := p.s[p.pos]
		p.pos++
		switch {
		case c == q:
			return value{kind: vString, str: b.String()}, nil
		case c == '\\':
			if p.eof() {
				return value{}, p.errorf("unterminated string")
			}
			e := p.s[p.pos]
			p.pos++
			if e != '\\' && e != '"' && e != '\'' {
				return value{}, p.errorf(`only \\, \" and \' are escapes`)
			}
			b.WriteByte(e)
		default:
			b.WriteByte(c)
		}
	}
}

// String renders the predicate in canonical form; parsing it gives the same
// predicate.
func (p *Predicate) String() string {
	if p == nil {
		return ""
	}
	parts := make([]string, len(p.conds))
	for i, c := range p.conds {
		var b strings.Builder
		b.WriteString(strings.Join(c.path, "."))
		b.WriteByte(' ')
		b.WriteString(opText[c.op])
		b.WriteByte(' ')
		switch c.op {
		case opMatch, opNotMatch:
			b.WriteString("/" + strings.ReplaceAll(c.reText, "/", `\/`) + "/")
		case opIn, opNotIn:
			b.WriteByte('[')
			for j, v := range c.vals {
				if j > 0 {
					b.WriteString(", ")
				}
				b.WriteString(v.String())
			}
			b.WriteByte(']')
		default:
			b.WriteString(c.vals[0].String())
		}
		parts[i] = b.String()
	}
	return strings.Join(parts, " && ")
}

func (v value) String() string {
	switch v.kind {
	case vNumber:
		return strconv.FormatFloat(v.num, 'g', -1, 64)
	case vBool:
		return strconv.FormatBool(v.b)
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v.str); i++ {
		if c := v.str[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(v.str[i])
	}
	b.WriteByte('"')
	return b.String()
}

// Args are a tool call's arguments, decoded once per decision.
type Args map[string]any

// DecodeArgs decodes a tool call's JSON arguments. Anything but a JSON
// object (including nil) gives no arguments, so every condition is false.
func DecodeArgs(raw json.RawMessage) Args {
	if len(raw) == 0 {
		return nil
	}
	var a map[string]any
	if json.Unmarshal(raw, &a) != nil {
		return nil
	}
	return a
}

// Eval reports whether every condition holds for args.
func (p *Predicate) Eval(args Args) bool {
	if p == nil {
		return true
	}
	for i := range p.conds {
		if !p.conds[i].eval(args) {
			return false
		}
	}
	return true
}

func (c *condition) eval(args Args) bool {
	var cur any = map[string]any(args)
	for _, k := range c.path {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[k]; !ok {
			return false
		}
	}
	switch c.op {
	case opMatch, opNotMatch:
		s, ok := cur.(string)
		return ok && c.re.MatchString(s) == (c.op == opMatch)
	case opIn, opNotIn:
		found, typed := false, false
		for _, v := range c.vals {
			eq, ok := v.equal(cur)
			typed = typed || ok
			found = found || eq
		}
		return typed && found == (c.op == opIn)
	case opEq, opNe:
		eq, ok := c.vals[0].equal(cur)
		return ok && eq == (c.op == opEq)
	}
	n, ok := cur.(float64)
	if !ok {
		return false
	}
	switch v := c.vals[0].num; c.op {
	case opLt:
		return n < v
	case opLe:
		return n <= v
	case opGt:
		return n > v
	default:
		return n >= v
	}
}

// equal compares v with a decoded JSON value; ok is false when the types
// differ.
func (v value) equal(x any) (eq, ok bool) {
	switch v.kind {
	case vNumber:
		n, ok := x.(float64)
		return ok && n == v.num, ok
	case vString:
		s, ok := x.(string)
		return ok && s == v.str, ok
	default:
		b, ok := x.(bool)
		return ok && b == v.b, ok
	}
}
