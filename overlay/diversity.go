package overlay

import (
	"net"
	"sync"

	"github.com/libp2p/go-libp2p-kbucket/peerdiversity"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Address limits (Config.PerAddress). Many peer IDs cost an attacker one
// key each and can all run behind one network address; the limits make
// what one address weighs independent of how many IDs it shows:
//
//   - Sample draws a peer whose address n live members share with weight
//     PerAddress/n (1 when n ≤ PerAddress), and at most PerAddress of them
//     into one sample (unless too few others are drawable), so together
//     they are in a sample as often as PerAddress peers with addresses of
//     their own.
//   - The DHT's routing table (go-libp2p-kad-dht's RoutingTablePeerDiversity-
//     Filter, with go-libp2p-kbucket's peerdiversity.Filter) admits at most
//     PerAddress peers of one address per bucket and 2·PerAddress in the
//     whole table, so one address cannot fill a bucket or crowd the
//     lookups' starting points.
//
// The address is the one the peer's connection comes from (the remote
// address the host observes, not one the peer advertises), or, for a peer
// not yet seen connected, the first address the peerstore holds for it:
// an IPv4 address whole, an IPv6 address by its /64 (what one host is
// usually given). Loopback addresses are exempt (a local testnet runs
// every node on 127.0.0.1). The grouping is narrower than peerdiversity's
// own (IPv4 /16, IPv6 by autonomous system): nodes of one job often run in
// one data centre, whose addresses share a /16 and an AS, and that
// grouping would cap the routing table at a couple of them.

// addrKey returns the address group of a, or "" when a has no IP address
// or a loopback one (exempt from the limits).
func addrKey(a ma.Multiaddr) string {
	ip, err := manet.ToIP(a)
	if err != nil || ip.IsLoopback() || ip.IsUnspecified() {
		return ""
	}
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// connAddrKey returns the address group p's open connections come from,
// or "" when there is none (or it is exempt); conns says whether p has any.
func connAddrKey(h host.Host, p peer.ID) (key string, conns bool) {
	cs := h.Network().ConnsToPeer(p)
	for _, c := range cs {
		if k := addrKey(c.RemoteMultiaddr()); k != "" {
			return k, true
		}
	}
	return "", len(cs) > 0
}

// storedAddrKey returns the address group of the first address the
// peerstore holds for p (advertised by p or named by others), or "".
func storedAddrKey(h host.Host, p peer.ID) string {
	for _, a := range h.Peerstore().Addrs(p) {
		if k := addrKey(a); k != "" {
			return k
		}
	}
	return ""
}

// setAddrLocked records the address group m connects from, keeping
// addrCount up to date: it counts live members with first-hand evidence of
// life per group. Peers only named by others do not count: anyone can name
// any number of made-up peers at a victim's address, which would otherwise
// cut the victim's weight in Sample.
func (o *Overlay) setAddrLocked(m *member, key string) {
	if key == m.addr {
		return
	}
	if m.counted() {
		o.countAddrLocked(m.addr, -1)
		o.countAddrLocked(key, 1)
	}
	m.addr = key
}

func (o *Overlay) countAddrLocked(key string, d int) {
	if key == "" {
		return
	}
	before := o.addrCount[key]
	after := before + d
	if after <= 0 {
		delete(o.addrCount, key)
	} else {
		o.addrCount[key] = after
	}
	if was, is := before > o.cfg.PerAddress, after > o.cfg.PerAddress; was != is {
		if is {
			o.crowded++
		} else {
			o.crowded--
		}
	}
}

// weightLocked is the weight Sample gives m: PerAddress/n when n > PerAddress
// live members with first-hand evidence of life share m's address, 1
// otherwise.
func (o *Overlay) weightLocked(m *member) float64 {
	if o.cfg.PerAddress <= 0 || m.addr == "" || o.crowded == 0 {
		return 1 // crowded == 0: no address is shared by more than PerAddress (no lookup per draw)
	}
	if n := o.addrCount[m.addr]; n > o.cfg.PerAddress {
		return float64(o.cfg.PerAddress) / float64(n)
	}
	return 1
}

// rtAddrFilter is the routing table's peerdiversity.PeerIPGroupFilter: at
// most perCpl peers of one address group per bucket (common-prefix length
// with self) and perTable in the table. It groups by addrKey, not by the
// peerdiversity.PeerIPGroupKey the filter passes in (see above).
type rtAddrFilter struct {
	h        host.Host
	perCpl   int
	perTable int

	mu    sync.Mutex
	peers map[peer.ID]admitted // admitted peers with an address group
	table map[string]int
	byCpl map[int]map[string]int
}

type admitted struct {
	key string
	cpl int
}

var _ peerdiversity.PeerIPGroupFilter = (*rtAddrFilter)(nil)

func newRTAddrFilter(h host.Host, perAddress int) *rtAddrFilter {
	return &rtAddrFilter{
		h: h, perCpl: perAddress, perTable: 2 * perAddress,
		peers: make(map[peer.ID]admitted), table: make(map[string]int), byCpl: make(map[int]map[string]int),
	}
}

func (f *rtAddrFilter) key(p peer.ID) string {
	for _, a := range f.PeerAddresses(p) {
		if k := addrKey(a); k != "" {
			return k
		}
	}
	return ""
}

// Allow admits p unless its address group already has perCpl peers in its
// bucket or perTable in the table.
func (f *rtAddrFilter) Allow(g peerdiversity.PeerGroupInfo) bool {
	k := f.key(g.Id)
	if k == "" {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.peers[g.Id]; ok {
		return true
	}
	return f.table[k] < f.perTable && f.byCpl[g.Cpl][k] < f.perCpl
}

// Increment counts an admitted peer once, however many addresses the
// filter calls it for.
func (f *rtAddrFilter) Increment(g peerdiversity.PeerGroupInfo) {
	k := f.key(g.Id)
	if k == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.peers[g.Id]; ok {
		return
	}
	f.peers[g.Id] = admitted{k, g.Cpl}
	f.table[k]++
	if f.byCpl[g.Cpl] == nil {
		f.byCpl[g.Cpl] = make(map[string]int)
	}
	f.byCpl[g.Cpl][k]++
}

// Decrement forgets a peer that left the table.
func (f *rtAddrFilter) Decrement(g peerdiversity.PeerGroupInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.peers[g.Id]
	if !ok {
		return
	}
	delete(f.peers, g.Id)
	if f.table[a.key]--; f.table[a.key] <= 0 {
		delete(f.table, a.key)
	}
	if c := f.byCpl[a.cpl]; c != nil {
		if c[a.key]--; c[a.key] <= 0 {
			delete(c, a.key)
		}
		if len(c) == 0 {
			delete(f.byCpl, a.cpl)
		}
	}
}

// PeerAddresses returns the addresses p's connections come from, or, with
// none open, the addresses the peerstore holds for p; only addresses with
// an IP (peerdiversity.Filter refuses a peer with any other).
func (f *rtAddrFilter) PeerAddresses(p peer.ID) []ma.Multiaddr {
	var out []ma.Multiaddr
	for _, c := range f.h.Network().ConnsToPeer(p) {
		if a := c.RemoteMultiaddr(); hasIP(a) {
			out = append(out, a)
		}
	}
	if len(out) > 0 {
		return out
	}
	for _, a := range f.h.Peerstore().Addrs(p) {
		if hasIP(a) {
			out = append(out, a)
		}
	}
	return out
}

func hasIP(a ma.Multiaddr) bool {
	_, err := manet.ToIP(a)
	return err == nil
}
