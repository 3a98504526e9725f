package overlay

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	kb "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrTooFewPeers is returned by Estimate (and by the individual estimators)
// when there is too little data for an honest answer.
var ErrTooFewPeers = errors.New("overlay: too few peers for an estimate")

// keyBits is the width of the DHT key space (SHA-256).
const keyBits = 256

// report is a peer's latest population report, when it came, and since
// when the peer has been reporting (without a gap of ReportMaxAge).
type report struct {
	n     float64
	at    time.Time
	since time.Time
}

type estCache struct {
	at     time.Time
	n, se  float64
	err    error
	zone   zoneEstimate
	zerr   error
	ordN   float64
	ordSE  float64
	ordErr error
}

// ObserveEstimate feeds the population estimate a peer reported (the step
// reply carries it). Nonsense values are ignored; the latest report per
// peer counts for ReportMaxAge. Peers should report LocalEstimate, not
// Estimate, so that reports stay independent. A report shows in Estimate
// within estCacheTTL: reports arrive with every step reply, and recomputing
// the estimate for each one cost 5 % of a 200-node testnet's CPU.
func (o *Overlay) ObserveEstimate(from peer.ID, n float64) {
	if from == o.h.ID() || math.IsNaN(n) || math.IsInf(n, 0) || n < 1 || n > 1e9 || o.held.has(from) {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.observeLocked(from, n, time.Now())
}

// observeLocked keeps n as from's latest report at now; from has been
// reporting since its first report without a gap of ReportMaxAge. o.mu is
// held.
func (o *Overlay) observeLocked(from peer.ID, n float64, now time.Time) {
	since := now
	if r, ok := o.reports[from]; ok && now.Sub(r.at) < o.cfg.ReportMaxAge {
		since = r.since
	}
	o.reports[from] = report{n: n, at: now, since: since}
}

// estCacheTTL is how long a computed estimate is reused. Recomputing walks
// the member set; at 500 nodes in one process, with the 250 ms this was
// before, that was 5 % of the testnet's CPU. Estimates move over tens of
// seconds (EstimateWindow, ReportMaxAge), so a second's staleness is noise.
const estCacheTTL = time.Second

// LocalEstimate returns this node's own population estimate (N̂ including
// self) and its standard error: the zone-density estimate fused by inverse
// variance with the order-statistics estimate from random-key lookups.
// It returns ErrTooFewPeers when neither estimator has enough data.
func (o *Overlay) LocalEstimate() (n, stderr float64, err error) {
	c := o.estimates()
	if c.zerr != nil && c.ordErr != nil {
		return 0, 0, fmt.Errorf("overlay: local estimate: %w", ErrTooFewPeers)
	}
	var ns, ses []float64
	if c.zerr == nil {
		ns, ses = append(ns, c.zone.N), append(ses, c.zone.SE)
	}
	if c.ordErr == nil {
		ns, ses = append(ns, c.ordN), append(ses, c.ordSE)
	}
	n, se, _ := fuseIV(ns, ses)
	return n, se, nil
}

// Estimate returns the population estimate N̂ (self included) and its
// standard error: LocalEstimate fused with the fresh estimates peers
// reported through ObserveEstimate. It returns an error wrapping
// ErrTooFewPeers when there is too little data for an honest answer.
func (o *Overlay) Estimate() (n float64, stderr float64, err error) {
	c := o.estimates()
	return c.n, c.se, c.err
}

// PeerReport is a peer's latest population report (ObserveEstimate) and
// how long the node has known the peer first-hand (or, for a peer it has
// no record of, how long the peer has been reporting without a gap of
// ReportMaxAge).
type PeerReport struct {
	N   float64
	For time.Duration
}

// PeerReports returns every peer's latest report, if it is younger than
// ReportMaxAge and the peer is not known dead: one per peer, however often
// it reports, with how long the peer has been known. Unlike Estimate it is read afresh at each call, so a report
// counts at once (a joiner asks its first peers for their estimates and
// uses them right away).
func (o *Overlay) PeerReports() []PeerReport {
	now := time.Now()
	cut := now.Add(-o.cfg.ReportMaxAge)
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]PeerReport, 0, len(o.reports))
	for p, r := range o.reports {
		if r.at.Before(cut) {
			continue
		}
		since := r.since
		if m, ok := o.members[p]; ok {
			if m.dead {
				continue
			}
			if !m.known.IsZero() {
				since = m.known
			}
		}
		out = append(out, PeerReport{N: r.n, For: now.Sub(since)})
	}
	return out
}

// medianSorted is the median of sorted, non-empty xs.
func medianSorted(xs []float64) float64 {
	k := len(xs)
	if k%2 == 1 {
		return xs[k/2]
	}
	return (xs[k/2-1] + xs[k/2]) / 2
}

// ReportBand bounds the peer reports that count in Estimate: within a
// factor of ReportBand of their median. Honest estimates of one network
// agree within tens of per cent (each has a relative error of about
// 1/√n_c); a report four times off is a liar's, or a joiner's that has
// not seen the network yet.
const ReportBand = 4

// inBand returns the reports within a factor of ReportBand of their
// median, in the order given. The node's own estimate (local, if ok) votes
// in the median too, votes times, so that liars among the first few peers
// to report do not set it (localVotes).
func inBand(reports []float64, local float64, ok bool, votes int) []float64 {
	if len(reports) == 0 {
		return reports
	}
	s := slices.Clone(reports)
	if ok {
		for range max(votes, 1) {
			s = append(s, local)
		}
	}
	slices.Sort(s)
	med := medianSorted(s)
	out := reports[:0:0]
	for _, v := range reports {
		if v >= med/ReportBand && v <= med*ReportBand {
			out = append(out, v)
		}
	}
	return out
}

// EstimateDetail is the breakdown behind Estimate, for diagnostics.
type EstimateDetail struct {
	ZoneN, ZoneSE   float64 // zone density (0 if unavailable)
	ZoneDepth       int
	ZoneCount       int
	OrderN, OrderSE float64 // order statistics (0 if unavailable)
	Lookups         int
	Reports         int
	N, SE           float64 // fused
	Err             error
}

// EstimateDetail returns the estimators' separate results.
func (o *Overlay) EstimateDetail() EstimateDetail {
	c := o.estimates()
	o.mu.Lock()
	d := EstimateDetail{ZoneDepth: c.zone.Depth, ZoneCount: c.zone.Count, Lookups: len(o.lookups), Reports: len(o.reports), N: c.n, SE: c.se, Err: c.err}
	o.mu.Unlock()
	if c.zerr == nil {
		d.ZoneN, d.ZoneSE = c.zone.N, c.zone.SE
	}
	if c.ordErr == nil {
		d.OrderN, d.OrderSE = c.ordN, c.ordSE
	}
	return d
}

func (o *Overlay) estimates() estCache {
	now := time.Now()
	o.mu.Lock()
	if now.Sub(o.estCache.at) < estCacheTTL {
		c := o.estCache
		o.mu.Unlock()
		return c
	}
	o.mu.Unlock()

	rtPeers := o.dht.RoutingTable().ListPeers()

	o.mu.Lock()
	defer o.mu.Unlock()
	var c estCache
	c.at = now

	// Zone density: counts by CPL over live peers that have shown first-
	// hand signs of life (kept up to date as peers come and go, so this is
	// not a pass over every member) or are in the routing table;
	// fullness from the routing table's own buckets.
	counts := make([]int, keyBits+1)
	copy(counts, o.confirmedByCPL[:])
	rtCounts := make([]int, keyBits+1)
	for _, p := range rtPeers {
		if m, ok := o.members[p]; ok {
			rtCounts[m.cpl]++
			if !m.dead && m.confirmed.IsZero() {
				counts[m.cpl]++
			}
		} else {
			rtCounts[cpl(o.selfKey, kb.ConvertPeerID(p))]++
		}
	}
	full := make([]bool, keyBits+1)
	for j, n := range rtCounts {
		full[j] = n >= o.cfg.BucketSize
	}
	c.zone, c.zerr = estimateZone(counts, full, o.cfg.MinZonePeers)
	o.zoneDepth = c.zone.Depth

	// Order statistics over the MaxLookups most recent random-walk lookups
	// of the window (o.lookups is in time order).
	cut := now.Add(-o.cfg.EstimateWindow)
	o.lookups = slices.DeleteFunc(o.lookups, func(s lookupSample) bool { return s.At.Before(cut) })
	if extra := len(o.lookups) - o.cfg.MaxLookups; extra > 0 {
		o.lookups = slices.Delete(o.lookups, 0, extra)
	}
	c.ordN, c.ordSE, c.ordErr = estimateOrder(o.lookups, o.cfg.BucketSize, o.cfg.MinLookups)

	// Local fusion.
	var ns, ses []float64
	if c.zerr == nil {
		ns, ses = append(ns, c.zone.N), append(ses, c.zone.SE)
	}
	if c.ordErr == nil {
		ns, ses = append(ns, c.ordN), append(ses, c.ordSE)
	}
	ln, lse, lok := fuseIV(ns, ses)

	// Peer reports: the freshest MaxReports distinct peers (ties, which
	// are common when reports come in together, by peer ID rather than by
	// map order, so that the same reports give the same estimate).
	type rep struct {
		p  peer.ID
		n  float64
		at time.Time
	}
	var reps []rep
	rcut := now.Add(-o.cfg.ReportMaxAge)
	for p, r := range o.reports {
		if r.at.Before(rcut) {
			delete(o.reports, p)
			continue
		}
		if m, ok := o.members[p]; ok && m.dead {
			continue
		}
		reps = append(reps, rep{p: p, n: r.n, at: r.at})
	}
	slices.SortFunc(reps, func(a, b rep) int {
		if c := b.at.Compare(a.at); c != 0 {
			return c
		}
		return cmp.Compare(a.p, b.p)
	})
	if len(reps) > o.cfg.MaxReports {
		reps = reps[:o.cfg.MaxReports]
	}
	vals := make([]float64, len(reps))
	for i, r := range reps {
		vals[i] = r.n
	}
	known := 0
	for _, k := range o.confirmedByCPL {
		known += k
	}
	c.n, c.se, c.err = fuseReports(ln, lse, lok, vals, localVotes(len(vals), known))
	if c.err != nil {
		c.err = fmt.Errorf("overlay: estimate: %w", c.err)
	}
	o.estCache = c
	return c
}

// zoneEstimate is the result of the zone-density estimator.
type zoneEstimate struct {
	N, SE float64 // population estimate (self included) and its standard error
	Depth int     // zone depth c: the zone is every ID sharing ≥ c bits with self
	Count int     // n_c: known live peers in the zone
}

// estimateZone computes N̂ = 1 + 2^c·n_c from counts of known live peers by
// common-prefix length with self (counts[j] = peers with CPL exactly j) and
// from which routing-table buckets are full (full[j]: the bucket for CPL j
// holds k peers, so it may be missing peers). Below the deepest full bucket
// no bucket is full, so every zone from there down is completely known; the
// zone depth c is one level deeper still. The first bucket below the
// deepest full one is the one whose own count (fewer than k) made it the
// first not full, so counting it would read N low: by 3 % with perfect
// knowledge (2000 synthetic ID sets at N = 200 to 3000; TestZoneEstimator-
// Synthetic checks the bias). If that deeper zone holds fewer than
// minPeers, the zone starts at the first bucket after all. n_c is Poisson
// with mean (N−1)/2^c, so the standard error of N̂ is 2^c·√n_c (relative
// error ≈ 1/√n_c). With no full bucket (c = 0) the count is the whole
// (small) network, and only missed peers add error.
func estimateZone(counts []int, full []bool, minPeers int) (zoneEstimate, error) {
	c := 0
	for j := len(full) - 1; j >= 0; j-- {
		if full[j] {
			c = j + 2
			break
		}
	}
	zone := func(c int) (n int) {
		for j := c; j < len(counts); j++ {
			n += counts[j]
		}
		return n
	}
	n := zone(c)
	if c > 0 && n < minPeers {
		c--
		n = zone(c)
	}
	if n == 0 || (c > 0 && n < minPeers) {
		return zoneEstimate{Depth: c, Count: n}, ErrTooFewPeers
	}
	scale := math.Ldexp(1, c)
	est := zoneEstimate{N: 1 + scale*float64(n), Depth: c, Count: n}
	if c == 0 {
		// Complete knowledge of a small network: the only error is peers
		// not yet discovered. Report a modest heuristic error.
		est.SE = math.Max(1, 0.05*float64(n))
	} else {
		est.SE = scale * math.Sqrt(float64(n))
	}
	return est, nil
}

// lookupSample is one random-key lookup for the order-statistics estimator:
// K peers came back and the K-th closest lies at normalised XOR distance
// DK (distance / 2^256) from the key.
type lookupSample struct {
	At time.Time
	K  int
	DK float64
}

// estimateOrder is the order-statistics estimator over random-key lookups
// (the idea of go-libp2p-kad-dht's netsize package). The other N−1 IDs are
// uniform, so the normalised distance from a random key to its K-th
// closest ID is about Gamma(K, rate N−1), and over L lookups ΣD_K is
// Gamma(ΣK, N−1): the unbiased estimate is N̂ − 1 = (ΣK − 1)/ΣD_K with
// relative standard error 1/√(ΣK − 2). A lookup returning fewer than
// bucketSize peers means the network is smaller than k+1: then N̂ = 1 + K.
func estimateOrder(samples []lookupSample, bucketSize, minLookups int) (float64, float64, error) {
	maxK, full := 0, 0
	var sumK, sumD float64
	for _, s := range samples {
		maxK = max(maxK, s.K)
		if s.K >= bucketSize && s.DK > 0 {
			full++
			sumK += float64(s.K)
			sumD += s.DK
		}
	}
	if len(samples) == 0 || maxK == 0 {
		return 0, 0, ErrTooFewPeers
	}
	if maxK < bucketSize {
		if len(samples) < minLookups {
			return 0, 0, ErrTooFewPeers
		}
		n := 1 + float64(maxK)
		return n, math.Max(1, 0.05*n), nil
	}
	if full < minLookups || sumK < 3 {
		return 0, 0, ErrTooFewPeers
	}
	n := (sumK - 1) / sumD
	return 1 + n, n / math.Sqrt(sumK-2), nil
}

// normXOR returns an XOR distance between two 32-byte keys (big-endian
// bytes) divided by 2^256, from its top 64 bits (ample precision for
// distances above 2^-50).
func normXOR(d []byte) float64 {
	var x [8]byte
	copy(x[:], d)
	return float64(binary.BigEndian.Uint64(x[:])) / math.Ldexp(1, 64)
}

// cpl returns the common-prefix length of two keys in bits.
func cpl(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		x := a[i] ^ b[i]
		if x != 0 {
			bits := 0
			for x&0x80 == 0 {
				x <<= 1
				bits++
			}
			return i*8 + bits
		}
	}
	return n * 8
}

// fuseIV combines independent estimates by inverse-variance weighting. It
// skips estimates with a non-positive standard error.
func fuseIV(ns, ses []float64) (float64, float64, bool) {
	var w, wn float64
	for i := range ns {
		if ses[i] <= 0 || math.IsNaN(ns[i]) || math.IsInf(ns[i], 0) {
			continue
		}
		wi := 1 / (ses[i] * ses[i])
		w += wi
		wn += wi * ns[i]
	}
	if w == 0 {
		return 0, 0, false
	}
	return wn / w, 1 / math.Sqrt(w), true
}

// trimmedMean returns the mean of xs after dropping the lowest and highest
// 10 % (at least one each when there are 5 or more values), which bounds the
// influence of a few wild or hostile reports, and the standard deviation of
// the kept values.
func trimmedMean(xs []float64) (mean, sd float64) {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	cut := len(s) / 10
	if cut == 0 && len(s) >= 5 {
		cut = 1
	}
	s = s[cut : len(s)-cut]
	for _, x := range s {
		mean += x
	}
	mean /= float64(len(s))
	for _, x := range s {
		sd += (x - mean) * (x - mean)
	}
	if len(s) > 1 {
		sd = math.Sqrt(sd / float64(len(s)-1))
	}
	return mean, sd
}

// localVotes is how many votes the node's own estimate has in the band's
// median beside m peers' reports, for a node that knows known live peers:
// as many as half of them that have not reported, and at least one. Peers
// that lie report as often as they like, the honest ones when they happen
// to ask or be asked: at the start of a run, ten liars among a hundred
// nodes sending twenty queries a second were half the first peers heard
// from. Until half the peers have reported, the own estimate holds the
// median; after, the reports do. In a run without liars the band leaves
// out no report either way (honest estimates agree within it).
func localVotes(m, known int) int { return max(1, (known+1)/2-m) }

// fuseReports combines a local estimate (n, se; ok=false if none) with peer
// reports. Reports more than a factor of ReportBand from their median (the
// local estimate voting votes times) are left out (inBand): with a few
// reports the trimmed mean trims nothing, and one liar among three honest
// reports moved it a hundred-million-fold.
// Each report is treated as an independent estimate of similar
// precision to ours (the same method on another zone), so the reports'
// trimmed mean gets weight m against our 1; without a local estimate the
// trimmed mean stands alone with its sample standard error. Needs at least
// 3 reports to say anything without a local estimate.
func fuseReports(n, se float64, ok bool, reports []float64, votes int) (float64, float64, error) {
	reports = inBand(reports, n, ok, votes)
	m := len(reports)
	switch {
	case m == 0 && ok:
		return n, se, nil
	case m == 0 || (!ok && m < 3):
		return 0, 0, ErrTooFewPeers
	}
	mean, sd := trimmedMean(reports)
	if !ok {
		return mean, math.Max(sd/math.Sqrt(float64(m)), 0.01*mean), nil
	}
	fm := float64(m)
	fused := (n + fm*mean) / (1 + fm)
	// Each report is assumed to carry our relative error; the fused error
	// shrinks by √(1+m) under independence. Disagreement beyond that shows
	// up through sd and is added.
	rel := se / n
	fse := fused * rel / math.Sqrt(1+fm)
	if m > 1 {
		fse = math.Max(fse, sd/math.Sqrt(fm+1))
	}
	return fused, fse, nil
}
