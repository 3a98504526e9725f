package lineage

import "time"

// Which lineage is the job's.
//
// A node that hears a peer on another lineage asks a uniform sample of its
// peers which lineage each is on and tallies the answers: per lineage, the
// peers of the sample on it and the longest this node has heard one of
// them on it without a break (History); for its own lineage, itself as
// one more peer and, as History, how long it has been on it. What the
// tally can be given cheaply is identities (each a key, on an address of
// its own) and claims (a genesis, a step); what it cannot is time: a
// history on a lineage as this node has seen it, and the node's own. So:
//
//   - An established node (it has trained on its lineage beside a peer of
//     the same lineage for YoungFor) moves only to a lineage it has heard
//     for longer than it has been on its own (by more than TieWithin), or,
//     within TieWithin of that, to one with more peers in the sample than
//     its own, itself counted. Peers it has just met, however many, move
//     it nowhere until they have been heard on their lineage about as long
//     as it has trained on its own (up to HistoryCap); then only a
//     majority of the sample does.
//   - A young node (it has trained beside no peer of its lineage for
//     YoungFor: a node restarted alone, nodes that started the job at the
//     same moment) goes where more of the sample is than on its own
//     lineage, itself counted; on a tie it moves with probability one
//     half, so that two lone nodes, each on a lineage of its own, settle
//     on one in a few looks instead of swapping forever.
//   - A node without a lineage (joining) takes the one most of the sample
//     is on, the longest heard breaking a tie, then a draw.
//
// No tie is broken by a field a peer chooses.
const (
	// YoungFor is how long a node trains beside a peer of its lineage
	// before only history moves it.
	YoungFor = 10 * time.Second
	// HistoryCap caps every history: two lineages each heard for longer
	// are as old as each other, and the sample's count decides. Peers that
	// stay on another lineage that long with more identities than the
	// node's lineage has in its sample take it.
	HistoryCap = 10 * time.Minute
	// TieWithin is how close two histories are to be as old: forks of one
	// launch differ by the seconds their nodes took to settle.
	TieWithin = 5 * time.Second
)

// Tally is what a sample said of one lineage.
type Tally struct {
	Genesis Genesis
	// Peers is how many peers of the sample are on it (for the node's own
	// lineage, the node counted too).
	Peers int
	// History is, for another lineage, the longest any of its peers in
	// the sample has been heard on it; for the node's own, how long the
	// node has been on it. Capped at HistoryCap.
	History time.Duration
}

// Decide is the lineage a node on own (zero: none yet) takes, given a
// sample's tallies (own's among them, if own is not zero) and whether the
// node is young (see above). pick(n) draws uniformly in [0, n): it breaks
// ties that nothing else can. Tallies of the zero Genesis are ignored.
func Decide(own Genesis, young bool, tallies []Tally, pick func(n int) int) Genesis {
	var mine Tally
	var others []Tally
	for _, t := range tallies {
		switch {
		case t.Genesis.IsZero():
		case t.Genesis == own:
			mine = t
		default:
			others = append(others, t)
		}
	}
	if len(others) == 0 {
		return own
	}
	byCount := func(a, b Tally) int {
		if c := a.Peers - b.Peers; c != 0 {
			return c
		}
		return int((a.History - b.History) / time.Millisecond)
	}
	if own.IsZero() {
		return best(others, byCount, pick).Genesis
	}
	if young {
		b := best(others, byCount, pick)
		if b.Peers > mine.Peers || b.Peers == mine.Peers && pick(2) == 0 {
			return b.Genesis
		}
		return own
	}
	// Established: a lineage heard for longer than the node has been on
	// its own moves it; one heard as long, by a majority.
	var older, asOld []Tally
	for _, t := range others {
		switch d := t.History - mine.History; {
		case d > TieWithin:
			older = append(older, t)
		case d >= -TieWithin:
			asOld = append(asOld, t)
		}
	}
	if len(older) > 0 {
		return best(older, func(a, b Tally) int {
			if c := int((a.History - b.History) / time.Millisecond); c != 0 {
				return c
			}
			return a.Peers - b.Peers
		}, pick).Genesis
	}
	if len(asOld) > 0 {
		if b := best(asOld, byCount, pick); b.Peers > mine.Peers {
			return b.Genesis
		}
	}
	return own
}

// best is the greatest of ts (not empty) by cmp, a draw among equals.
func best(ts []Tally, cmp func(a, b Tally) int, pick func(n int) int) Tally {
	var top []Tally
	for _, t := range ts {
		switch {
		case len(top) == 0:
			top = append(top, t)
		case cmp(t, top[0]) > 0:
			top = append(top[:0], t)
		case cmp(t, top[0]) == 0:
			top = append(top, t)
		}
	}
	if len(top) == 1 {
		return top[0]
	}
	return top[pick(len(top))]
}
