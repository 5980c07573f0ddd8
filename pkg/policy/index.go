package policy

import (
	"encoding/binary"
	"runtime"
	"strings"

	"github.com/casbin/casbin/v2"
	"github.com/casbin/casbin/v2/model"
)

// ruleIndex finds, for a question, the tenant's rules that can match it:
// those whose action is the question's action or a glob matching it, whose
// subject is "*", the principal or its role, and whose object takes in the
// node. Casbin then decides over these few rules instead of scanning all
// of them. The index only narrows the set: Casbin checks subject, action,
// object and predicate of every candidate again, so a candidate too many
// costs time, never correctness.
type ruleIndex struct {
	lines    [][]string       // the tenant's policy lines, in rule order
	byAction map[string][]int // exact action -> line numbers, ascending
	globs    []int            // lines whose action holds '*' or '?', ascending
	groups   map[string]map[string]bool
}

// Policy line fields, as in the model's policy_definition.
const (
	lineSub = 0
	lineObj = 1
	lineAct = 2
)

func newRuleIndex(lines [][]string, groups map[string]map[string]bool) ruleIndex {
	ix := ruleIndex{lines: lines, byAction: map[string][]int{}, groups: groups}
	for i, l := range lines {
		if strings.ContainsAny(l[lineAct], "*?") {
			ix.globs = append(ix.globs, i)
		} else {
			ix.byAction[l[lineAct]] = append(ix.byAction[l[lineAct]], i)
		}
	}
	return ix
}

// candidates returns the lines that can match k, in rule order (Casbin's
// first matching deny or allow names the decision, so order matters), and
// appends their line numbers to set.
func (ix *ruleIndex) candidates(k cacheKey, set []byte) ([][]string, []byte) {
	exact, globs := ix.byAction[k.act], ix.globs
	out := make([][]string, 0, 4)
	for len(exact) > 0 || len(globs) > 0 {
		var i int
		if len(globs) == 0 || len(exact) > 0 && exact[0] < globs[0] {
			i, exact = exact[0], exact[1:]
		} else {
			i, globs = globs[0], globs[1:]
			if !globMatch(ix.lines[i][lineAct], k.act) {
				continue
			}
		}
		if l := ix.lines[i]; subjectCanMatch(l[lineSub], k) && ix.objectCanMatch(l[lineObj], k.node) {
			out = append(out, l)
			set = binary.AppendUvarint(set, uint64(i))
		}
	}
	return out, set
}

// subjectCanMatch is the model's subject test: "*", the principal id, or
// "role:<role>".
func subjectCanMatch(sub string, k cacheKey) bool {
	if sub == SubjectAny || sub == k.sub {
		return true
	}
	role, ok := strings.CutPrefix(sub, RolePrefix)
	return ok && role == k.role
}

// objectCanMatch is the model's object test (xcObj): a node id glob, or a
// group of the tenant that holds the node.
func (ix *ruleIndex) objectCanMatch(obj, node string) bool {
	if g, ok := strings.CutPrefix(obj, GroupPrefix); ok {
		return ix.groups[g][node]
	}
	return globMatch(obj, node)
}

// scratchEnforcers lends Casbin enforcers of the engine's model that hold
// no policy of their own: a decision puts its candidate lines in, enforces
// and takes them out again. Enforcers are kept for reuse (building one
// costs tens of microseconds); the matcher functions find the tenant's
// rules and groups in the evaluation context, so any tenant can use any
// of them.
type scratchEnforcers struct {
	model model.Model
	idle  chan *casbin.Enforcer
}

func newScratchEnforcers(m model.Model) *scratchEnforcers {
	return &scratchEnforcers{model: m, idle: make(chan *casbin.Enforcer, 4*runtime.GOMAXPROCS(0))}
}

func (s *scratchEnforcers) get() (*casbin.Enforcer, error) {
	select {
	case enf := <-s.idle:
		return enf, nil
	default:
	}
	enf, err := casbin.NewEnforcer(s.model.Copy())
	if err != nil {
		return nil, err
	}
	enf.EnableAutoSave(false)
	addFunctions(enf)
	return enf, nil
}

func (s *scratchEnforcers) put(enf *casbin.Enforcer) {
	select {
	case s.idle <- enf:
	default: // enough idle ones; let this one go
	}
}

// enforce runs Casbin's EnforceEx over lines.
func (s *scratchEnforcers) enforce(lines [][]string, rvals ...any) (bool, []string, error) {
	enf, err := s.get()
	if err != nil {
		return false, nil, err
	}
	p := enf.GetModel()["p"]["p"]
	p.Policy = lines
	ok, explain, err := enf.EnforceEx(rvals...)
	p.Policy = nil // hold no tenant's rules while idle
	s.put(enf)
	return ok, explain, err
}
