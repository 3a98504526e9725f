package memnet

import (
	"context"
	"strconv"
	"sync"
	"time"

	ic "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// conn is one end of a connection between two hosts. The two ends refer
// to each other only while the connection is open: a closed connection
// (and every stream that was on it) lets go of the other host, so a host
// that closes is not kept alive by its peers' stale conns and streams.
type conn struct {
	net        *peerNet // this end's network
	id         int64
	local      peer.ID
	remote     peer.ID
	localAddr  ma.Multiaddr
	remoteAddr ma.Multiaddr
	remoteKey  ic.PubKey
	latency    time.Duration
	stat       network.ConnStats

	// notified is held from the conn's making until this end's Connected
	// notifications have gone out, so that Disconnected never comes first.
	notified sync.Mutex

	mu      sync.Mutex
	other   *conn // the other end; nil once closed
	closed  bool
	streams map[*stream]struct{}
}

var _ network.Conn = (*conn)(nil)

// NewStream opens a stream to the other end, whose network's stream
// handler gets it in a goroutine of its own.
func (c *conn) NewStream(context.Context) (network.Stream, error) {
	c.mu.Lock()
	other := c.other
	c.mu.Unlock()
	if other == nil {
		return nil, network.ErrReset
	}
	id := c.net.net.streamID.Add(1)
	ab, ba := newHalf(&c.net.net.alarms), newHalf(&c.net.net.alarms)
	now := time.Now()
	mine := &stream{conn: c, id: id, in: ba, out: ab, stat: network.Stats{Direction: network.DirOutbound, Opened: now}}
	theirs := &stream{conn: other, id: id, in: ab, out: ba, stat: network.Stats{Direction: network.DirInbound, Opened: now}}
	if !c.addStream(mine) || !other.addStream(theirs) {
		_ = mine.Reset()
		return nil, network.ErrReset
	}
	other.net.handleStream(theirs)
	return mine, nil
}

// addStream lists s on c; false if c has closed.
func (c *conn) addStream(s *stream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.streams[s] = struct{}{}
	return true
}

func (c *conn) removeStream(s *stream) {
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
}

func (c *conn) GetStreams() []network.Stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]network.Stream, 0, len(c.streams))
	for s := range c.streams {
		out = append(out, s)
	}
	return out
}

func (c *conn) IsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close closes both ends, resetting their streams.
func (c *conn) Close() error {
	c.mu.Lock()
	other := c.other
	c.mu.Unlock()
	c.teardown()
	if other != nil {
		other.teardown()
	}
	return nil
}

// teardown closes this end: resets its streams, forgets the other end and
// takes the conn off its network.
func (c *conn) teardown() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.other = nil
	streams := c.streams
	c.streams = nil
	c.mu.Unlock()
	for s := range streams {
		s.in.reset()
		s.out.reset()
		s.done.Store(true)
	}
	c.net.removeConn(c)
}

func (c *conn) CloseWithError(network.ConnErrorCode) error { return c.Close() }

func (c *conn) ID() string                         { return strconv.FormatInt(c.id, 10) }
func (c *conn) LocalPeer() peer.ID                 { return c.local }
func (c *conn) RemotePeer() peer.ID                { return c.remote }
func (c *conn) RemotePublicKey() ic.PubKey         { return c.remoteKey }
func (c *conn) ConnState() network.ConnectionState { return network.ConnectionState{} }
func (c *conn) LocalMultiaddr() ma.Multiaddr       { return c.localAddr }
func (c *conn) RemoteMultiaddr() ma.Multiaddr      { return c.remoteAddr }
func (c *conn) Scope() network.ConnScope           { return &network.NullScope{} }
func (c *conn) As(any) bool                        { return false }

func (c *conn) Stat() network.ConnStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stat
	st.NumStreams = len(c.streams)
	return st
}
