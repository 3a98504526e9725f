package plan

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Action is what a churn-script event does.
type Action string

// The churn-script actions.
const (
	Join  Action = "join"  // start new nodes that join through live ones
	Leave Action = "leave" // stop nodes gracefully (they tell peers)
	Crash Action = "crash" // stop nodes without a word
	// Partition splits the live nodes: the given fraction (or count) on one
	// side, the rest on the other; links between the sides are cut.
	Partition Action = "partition"
	// Heal ends a partition.
	Heal Action = "heal"
	// CrashHostile stops every node of a hostile or faulty role (see
	// Role) without a word: the attack ends, and the run shows how the
	// honest nodes recover.
	CrashHostile Action = "crash-hostile"
)

// Event is one line of a churn script: at time At, apply Action to Count
// nodes, or to the fraction Fraction of the live nodes.
type Event struct {
	At       time.Duration
	Action   Action
	Count    int
	Fraction float64
}

// String renders the event in script syntax.
func (e Event) String() string {
	if e.Action == Heal || e.Action == CrashHostile {
		return fmt.Sprintf("%s %s", e.At, e.Action)
	}
	n := strconv.Itoa(e.Count)
	if e.Fraction > 0 {
		n = strconv.FormatFloat(100*e.Fraction, 'g', -1, 64) + "%"
	}
	return fmt.Sprintf("%s %s %s", e.At, e.Action, n)
}

// maxScriptLines bounds a churn script.
const maxScriptLines = 100_000

// ParseScript reads a churn script: one event per line,
//
//	TIME ACTION COUNT
//
// where TIME is a Go duration from the start of training ("90s", "2m"),
// ACTION is join, leave, crash or partition, and COUNT a number of nodes
// ("10") or a percentage of the live nodes ("25%"); "TIME heal" (no count)
// ends a partition, and "TIME crash-hostile" (no count) stops every node
// of a hostile role. Blank lines and text after '#' are ignored. Events are returned in time order. Errors name the line.
func ParseScript(r io.Reader) ([]Event, error) {
	var evs []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	line := 0
	for sc.Scan() {
		line++
		if line > maxScriptLines {
			return nil, fmt.Errorf("churn script: more than %d lines", maxScriptLines)
		}
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		fail := func(format string, a ...any) ([]Event, error) {
			return nil, fmt.Errorf("churn script line %d %q: %s", line, strings.TrimSpace(sc.Text()), fmt.Sprintf(format, a...))
		}
		if len(f) == 2 && (f[1] == string(Heal) || f[1] == string(CrashHostile)) {
			f = append(f, "1")
		}
		if len(f) != 3 {
			return fail("want TIME ACTION COUNT, e.g. \"60s crash 10%%\", or TIME heal, or TIME crash-hostile")
		}
		at, err := time.ParseDuration(f[0])
		if err != nil || at < 0 {
			return fail("time %q is not a non-negative duration such as 90s", f[0])
		}
		ev := Event{At: at, Action: Action(f[1])}
		switch ev.Action {
		case Join, Leave, Crash, Partition, Heal, CrashHostile:
		default:
			return fail("action %q: want join, leave, crash, partition, heal or crash-hostile", f[1])
		}
		if pct, ok := strings.CutSuffix(f[2], "%"); ok {
			v, err := strconv.ParseFloat(pct, 64)
			if err != nil || !(v > 0 && v <= 100) {
				return fail("percentage %q: want a number in (0, 100]", f[2])
			}
			ev.Fraction = v / 100
		} else {
			v, err := strconv.Atoi(f[2])
			if err != nil || v < 1 || v > 100_000 {
				return fail("count %q: want a whole number from 1 to 100000, or a percentage", f[2])
			}
			ev.Count = v
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("churn script: line %d: %w", line+1, err)
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return int(a.At - b.At) })
	return evs, nil
}
