// The topic of a job's updates: its Config, joining it (New), Publish,
// Subscribe and the validator. The package doc is in doc.go.

package gossip

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/pspnode/pspnode/internal/f32"
	"github.com/pspnode/pspnode/internal/faults"
	"github.com/pspnode/pspnode/internal/jobname"
)

// ErrClosed is returned by Publish after Close.
var ErrClosed = errors.New("gossip: closed")

// TopicName returns the GossipSub topic of a job's updates: psp/<job>/updates/1.
func TopicName(job string) string {
	return "psp/" + job + "/updates/1"
}

// Config configures a Gossip. Start from DefaultConfig and set at least Job
// and ParamCount.
type Config struct {
	// Job namespaces the topic: psp/<Job>/updates/1. 1 to 64 letters,
	// digits, '.', '_' or '-' (the rule node and overlay use).
	Job string

	// ParamCount is the length of the model's parameter vector. Updates of
	// any other length are rejected. Required.
	ParamCount int

	// ModelID identifies the model architecture and configuration (e.g. a
	// hash of its shape); updates carrying another ID are rejected. Nodes of
	// one job must agree on it. Zero is a valid ID.
	ModelID uint32

	// Encoding of published updates. Receivers accept every encoding.
	Encoding Encoding

	// TopKFraction is the fraction of entries a top-k update carries,
	// k = ceil(TopKFraction × ParamCount). Used by the top-k encodings only.
	TopKFraction float64

	// MaxMessageSize caps an encoded update in bytes; 0 means
	// MaxEncodedSize(ParamCount), the largest update the encoder can emit.
	MaxMessageSize int

	// MaxAbsValue caps |value| of every received entry; larger values are
	// rejected. Published values are clamped to it (the rest stays in the
	// error-feedback residual and goes out in later updates; Stats.Clamped
	// counts them), so a node's own large delta is never refused.
	MaxAbsValue float64

	// MaxStepAhead is how far beyond this node's own step (see SetLocalStep)
	// an update's step may be; updates further ahead are ignored (not
	// penalised, see Reason.Ignore). <= 0 disables the check.
	MaxStepAhead int64

	// Handler, if non-nil, receives every valid update from another node.
	// More handlers can be added with Subscribe. Handlers run one at a time
	// on the receive goroutine: keep them short, updates queue behind them
	// (up to BufferSize, then GossipSub drops).
	Handler func(Update)

	// BufferSize is the subscription's queue length.
	BufferSize int

	// Logger receives debug logs of rejections; nil discards them (as in
	// node and overlay).
	Logger *slog.Logger

	// Registerer, if non-nil, gets the package's prometheus counters
	// (psp_gossip_*). Several Gossips in one process need distinct
	// registerers, e.g. prometheus.WrapRegistererWith(node label).
	Registerer prometheus.Registerer

	// PubSub, if non-nil, is an existing router to join the topic on; build
	// it with PubSubOptions(cfg) so that signing, scoring and size limits
	// are as described here. If nil, New starts a GossipSub router of its
	// own with those options, and Close stops it. A host can run only one
	// router, so share one PubSub when a node uses pubsub elsewhere too.
	PubSub *pubsub.PubSub

	// PeerScoring turns on GossipSub peer scoring (TopicScore returns the
	// parameters). The IP-colocation penalty is always off: testnets run
	// hundreds of nodes on one address.
	PeerScoring bool

	// FloodPublish sends own updates to every topic peer above the publish
	// threshold instead of only to mesh peers (forwarding is always by mesh).
	// On by default here (the library's default is off): most deliveries
	// are then one hop, which is what keeps updates arriving when the
	// updates fill the links (see DefaultConfig). Off, a node's update goes
	// to its mesh peers only, and one published before the heartbeat has
	// built the mesh would go to no one: a node calls WaitMesh before its
	// first step.
	FloodPublish bool

	// GossipSub holds the router's parameters (mesh degree, heartbeat, ...).
	GossipSub pubsub.GossipSubParams

	// drop, if set, is asked for every incoming message before validation;
	// true drops it as if lost on the way (ignored, no score penalty, not
	// forwarded). Fault injection for testnets (internal/faults); nil in
	// production.
	drop func() bool
}

// FaultDrop hands internal/faults the drop hook (faults.SetGossipDrop).
// Only this module can call it: its argument's type is internal.
func (c *Config) FaultDrop(faults.Key) *func() bool { return &c.drop }

// FaultPublish hands internal/faults publishRaw (faults.PublishRaw). Only
// this module can call it: its argument's type is internal.
func (g *Gossip) FaultPublish(faults.Key) faults.PublishFunc { return g.publishRaw }

// DefaultConfig returns a configuration for a job of 2..1000 nodes: dense
// float32 updates, top-k fraction 0.1 (when a top-k encoding is chosen), peer
// scoring on without IP-colocation penalty, strict signing, flood
// publishing, GossipSub with mesh degree 3 (2..4). ParamCount must still be
// set.
func DefaultConfig() Config {
	gs := pubsub.DefaultGossipSubParams()
	// Updates are large (31 KB for MNIST logistic regression), and a node
	// receives each one about once per mesh peer that forwards it, plus
	// the publisher's flooded copy: with D = 6 a node took in 6.3 times
	// the update bytes delivered to it at 16 nodes. IDONTWANT (on by
	// default for messages over 1 KB) only helps when copies queue on
	// saturated links; on links with room it races the duplicates it is
	// meant to stop. D = 3 halves the ratio (3.2) with the same accuracy.
	// Flood publishing off as well brings it to 1.7 on links with room,
	// but on saturated links (100 Mbit/s, 20 ms) updates relayed over
	// several hops were lost and accuracy fell from 0.86 to 0.62, where
	// flood publishing with D = 3 kept 0.87 at a ratio of 1.5
	// (docs/exchange.md). The price of D = 3: about log₂ N hops instead
	// of log₆ N, and no outbound quota in the mesh (Dout must be below
	// D/2), so a node's mesh may be all inbound peers.
	gs.D, gs.Dlo, gs.Dhi, gs.Dscore, gs.Dout = 3, 2, 4, 2, 0
	// Churn experiments restart nodes; rejoining after a prune should not
	// take a minute.
	gs.PruneBackoff = 20 * time.Second
	gs.UnsubscribeBackoff = 5 * time.Second
	return Config{
		Job:          "default",
		Encoding:     EncodingDense32,
		TopKFraction: 0.1,
		MaxAbsValue:  1e4,
		MaxStepAhead: 1 << 20,
		BufferSize:   256,
		PeerScoring:  true,
		FloodPublish: true,
		GossipSub:    gs,
	}
}

// check validates c and fills in the optional fields left zero.
func (c *Config) check() error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = MaxEncodedSize(c.ParamCount)
	}
	if c.BufferSize <= 0 {
		c.BufferSize = 256
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Validate reports the first unusable field of c. New and PubSubOptions
// call it; node, overlay and gossip each have one. Zero MaxMessageSize,
// BufferSize and Logger are not errors: New fills them in.
func (c Config) Validate() error {
	if err := jobname.Validate(c.Job); err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	if c.ParamCount <= 0 {
		return fmt.Errorf("gossip: ParamCount must be positive, got %d", c.ParamCount)
	}
	if !c.Encoding.valid() {
		return fmt.Errorf("gossip: %w: %d", ErrUnknownEncoding, c.Encoding)
	}
	if c.Encoding.sparse() && !(c.TopKFraction > 0 && c.TopKFraction <= 1) {
		return fmt.Errorf("gossip: TopKFraction must be in (0, 1], got %v", c.TopKFraction)
	}
	if !(c.MaxAbsValue > 0) {
		return fmt.Errorf("gossip: MaxAbsValue must be positive, got %v", c.MaxAbsValue)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("gossip: MaxMessageSize must be >= 0, got %d", c.MaxMessageSize)
	}
	return nil
}

func (c *Config) limits() Limits {
	return Limits{
		MaxMessageSize: c.MaxMessageSize,
		ParamCount:     c.ParamCount,
		ModelID:        c.ModelID,
		MaxAbsValue:    c.MaxAbsValue,
		MaxStepAhead:   c.MaxStepAhead,
	}
}

// queueBytes is what each of the router's message queues (each peer's
// outbound queue, the validation queue, the subscription) may hold of
// updates: a queue of a large model's updates holds this much, not its
// default count of them.
const queueBytes = 64 << 20

// queueFor is the length of a queue of messages of up to size bytes whose
// default length is def: def, or fewer for large messages (at least 2).
func queueFor(size, def int) int {
	if size <= 0 {
		return def
	}
	return max(2, min(def, queueBytes/size))
}

// rpcOverhead is room for the pubsub envelope around one update: from,
// seqno, topic, signature and key (an RSA key is ~300 bytes), protobuf tags.
const rpcOverhead = 4 << 10

// PubSubOptions returns the router options this package relies on: strict
// signing, a max RPC size that fits one update, the GossipSub parameters and,
// if cfg.PeerScoring, peer scoring with TopicScore(cfg) for the update topic.
func PubSubOptions(cfg Config) ([]pubsub.Option, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	gs := cfg.GossipSub
	q := queueFor(cfg.MaxMessageSize, 32)
	if q < 32 {
		// Large updates: the router's history (which its gossip answers
		// IWANTs from) holds every message of its window; keep the least
		// window that gossips (2 heartbeats, of which the last is gossiped).
		gs.HistoryLength, gs.HistoryGossip = min(gs.HistoryLength, 2), min(gs.HistoryGossip, 1)
	}
	opts := []pubsub.Option{
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithMaxMessageSize(max(pubsub.DefaultMaxMessageSize, cfg.MaxMessageSize+rpcOverhead)),
		pubsub.WithGossipSubParams(gs),
		pubsub.WithFloodPublish(cfg.FloodPublish),
		pubsub.WithPeerExchange(false),
		// The router's queues hold whole messages: for a large model they
		// hold a bounded number of them (queueFor), not 32 each.
		pubsub.WithPeerOutboundQueueSize(q),
		pubsub.WithValidateQueueSize(q),
	}
	if cfg.PeerScoring {
		params, thresholds := PeerScore(cfg)
		opts = append(opts, pubsub.WithPeerScore(params, thresholds))
	}
	return opts, nil
}

// PeerScore returns the peer-score parameters and thresholds used when
// cfg.PeerScoring is on. The ideas:
//
//   - Invalid messages (P4) dominate: weight -100 on the squared, slowly
//     decaying (1 h) count, so 3 invalid updates fall below the gossip
//     threshold (-500) and 5 below the graylist threshold (-2500), after
//     which the peer's messages are not even processed.
//   - First deliveries (P2, cap 20) and time in mesh (P1, cap 3) give honest
//     peers a small positive score.
//   - Mesh delivery deficits (P3, P3b) are off: a training job's message
//     rate follows its barrier and its stragglers, so a quiet peer is not a
//     misbehaving one.
//   - IP colocation (P6) is off (weight 0): testnets put every node on one
//     address. Behaviour penalties (P7) are the library's usual.
func PeerScore(cfg Config) (*pubsub.PeerScoreParams, *pubsub.PeerScoreThresholds) {
	topic := &pubsub.TopicScoreParams{
		TopicWeight:                    1,
		TimeInMeshWeight:               0.01,
		TimeInMeshQuantum:              time.Second,
		TimeInMeshCap:                  300,
		FirstMessageDeliveriesWeight:   1,
		FirstMessageDeliveriesDecay:    pubsub.ScoreParameterDecay(10 * time.Minute),
		FirstMessageDeliveriesCap:      20,
		InvalidMessageDeliveriesWeight: -100,
		InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(time.Hour),
	}
	params := &pubsub.PeerScoreParams{
		Topics:                      map[string]*pubsub.TopicScoreParams{TopicName(cfg.Job): topic},
		TopicScoreCap:               30,
		AppSpecificScore:            func(peer.ID) float64 { return 0 },
		AppSpecificWeight:           1,
		IPColocationFactorWeight:    0,
		IPColocationFactorThreshold: 1,
		BehaviourPenaltyWeight:      -10,
		BehaviourPenaltyThreshold:   6,
		BehaviourPenaltyDecay:       pubsub.ScoreParameterDecay(10 * time.Minute),
		DecayInterval:               pubsub.DefaultDecayInterval,
		DecayToZero:                 pubsub.DefaultDecayToZero,
		RetainScore:                 10 * time.Minute,
	}
	thresholds := &pubsub.PeerScoreThresholds{
		GossipThreshold:             -500,
		PublishThreshold:            -1000,
		GraylistThreshold:           -2500,
		AcceptPXThreshold:           100,
		OpportunisticGraftThreshold: 2,
	}
	return params, thresholds
}

// Gossip publishes this node's updates on the job's topic and delivers the
// valid updates of other nodes to handlers.
type Gossip struct {
	cfg    Config
	lim    Limits
	self   peer.ID
	h      host.Host
	log    *slog.Logger
	ps     *pubsub.PubSub
	ownPS  context.CancelFunc // non-nil if New started ps
	topic  *pubsub.Topic
	name   string
	sub    *pubsub.Subscription
	stats  *counters
	step   atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}
	mesh   *meshTracer

	pubMu sync.Mutex // serialises Encode (the encoder's residual)
	enc   *Encoder
	limit uint32 // f32.Limit of MaxAbsValue: Encode's direct way

	hmu      sync.Mutex
	handlers []handlerEntry
	nextID   int

	closeOnce sync.Once
	closed    atomic.Bool
	closeErr  error
}

type handlerEntry struct {
	id int
	fn func(Update)
}

// New joins the job's update topic on h and starts the receive goroutine.
// ctx bounds only the set-up; the Gossip runs until Close.
func New(ctx context.Context, h host.Host, cfg Config) (*Gossip, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	enc, err := NewEncoder(cfg.ParamCount, cfg.Encoding, cfg.TopKFraction, cfg.MaxAbsValue)
	if err != nil {
		return nil, err
	}
	stats, err := newCounters(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	g := &Gossip{
		cfg:   cfg,
		lim:   cfg.limits(),
		self:  h.ID(),
		h:     h,
		log:   cfg.Logger.With("component", "gossip", "topic", TopicName(cfg.Job)),
		name:  TopicName(cfg.Job),
		stats: stats,
		enc:   enc,
		limit: f32.Limit(boundOf(cfg.MaxAbsValue)),
		done:  make(chan struct{}),
	}
	if cfg.Handler != nil {
		g.handlers = append(g.handlers, handlerEntry{id: -1, fn: cfg.Handler})
	}
	ok := false
	defer func() {
		if !ok {
			g.teardown()
		}
	}()

	g.ps = cfg.PubSub
	if g.ps == nil {
		opts, err := PubSubOptions(cfg)
		if err != nil {
			return nil, err
		}
		// The router lives until Close, not until ctx: ctx is for set-up.
		psCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		g.ownPS = cancel
		if !cfg.FloodPublish {
			g.mesh = newMeshTracer(TopicName(cfg.Job))
			opts = append(opts, pubsub.WithRawTracer(g.mesh))
		}
		g.ps, err = pubsub.NewGossipSub(psCtx, h, opts...)
		if err != nil {
			return nil, fmt.Errorf("gossip: start gossipsub: %w", err)
		}
	}
	if err := g.ps.RegisterTopicValidator(g.name, g.validate); err != nil {
		return nil, fmt.Errorf("gossip: register validator on %s: %w", g.name, err)
	}
	g.topic, err = g.ps.Join(g.name)
	if err != nil {
		return nil, fmt.Errorf("gossip: join %s: %w", g.name, err)
	}
	g.sub, err = g.topic.Subscribe(pubsub.WithBufferSize(queueFor(cfg.MaxMessageSize, cfg.BufferSize)))
	if err != nil {
		return nil, fmt.Errorf("gossip: subscribe %s: %w", g.name, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("gossip: set-up: %w", err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go g.receive(loopCtx)
	ok = true
	return g, nil
}

// Topic returns the name of the update topic.
func (g *Gossip) Topic() string { return g.name }

// PubSub returns the router the topic is joined on.
func (g *Gossip) PubSub() *pubsub.PubSub { return g.ps }

// Peers returns the peers known to be subscribed to the topic.
func (g *Gossip) Peers() []peer.ID { return g.topic.ListPeers() }

// Stats returns a snapshot of the counters.
func (g *Gossip) Stats() Stats { return g.stats.snapshot() }

// SetLocalStep tells the validator this node's own step, against which
// MaxStepAhead is measured. Publish raises it to the published step.
func (g *Gossip) SetLocalStep(step int64) { g.step.Store(step) }

// LocalStep returns the step the validator measures MaxStepAhead from.
func (g *Gossip) LocalStep() int64 { return g.step.Load() }

// Subscribe adds a handler for valid updates from other nodes and returns a
// function that removes it. See Config.Handler.
func (g *Gossip) Subscribe(fn func(Update)) (cancel func()) {
	if fn == nil {
		return func() {}
	}
	g.hmu.Lock()
	defer g.hmu.Unlock()
	id := g.nextID
	g.nextID++
	g.handlers = append(g.handlers, handlerEntry{id: id, fn: fn})
	return func() {
		g.hmu.Lock()
		defer g.hmu.Unlock()
		for i, e := range g.handlers {
			if e.id == id {
				g.handlers = append(g.handlers[:i:i], g.handlers[i+1:]...)
				return
			}
		}
	}
}

// Publish encodes delta (this node's change to its model in the step that
// took it to step) with the configured encoding and publishes it: Encode,
// then PublishEncoded. The caller has already applied delta to its own
// model; this node's own update is not delivered back to it. With top-k or
// float16 encodings, what the update does not carry is kept and added to
// the next delta (error feedback). Values beyond ±MaxAbsValue are
// published clamped to it, and the clamped-off part is kept the same way
// (counted in Stats.Clamped), so peers still receive the whole delta, over
// several updates. A delta of the wrong length or with a NaN or infinite
// value is an error and nothing is published or kept. If publishing fails,
// what the message carried is kept for the next call.
func (g *Gossip) Publish(ctx context.Context, step int64, delta []float32) error {
	m, err := g.Encode(step, delta)
	if err != nil {
		return err
	}
	return g.PublishEncoded(ctx, m)
}

// Message is an update of this node's that Encode made and PublishEncoded
// publishes.
type Message struct {
	step    int64
	data    []byte
	u       *Update // the encoder's update, kept again if it is not published; nil: the delta went as it was
	clamped int
}

// Encode encodes delta, the update of step, into a message for
// PublishEncoded, as Publish does; delta is not kept (the caller may
// change it once Encode returns). Under the dense float32 encoding, with
// nothing held back from earlier deltas and every value finite and within
// ±MaxAbsValue, the values go into the message as they are (one copy);
// otherwise they take the encoder (error feedback, clamping).
func (g *Gossip) Encode(step int64, delta []float32) (*Message, error) {
	if g.closed.Load() {
		return nil, ErrClosed
	}
	if step < 0 {
		return nil, fmt.Errorf("gossip: publish: negative step %d", step)
	}
	if len(delta) != g.cfg.ParamCount {
		return nil, fmt.Errorf("gossip: publish step %d: %d values, want %d", step, len(delta), g.cfg.ParamCount)
	}
	g.pubMu.Lock()
	defer g.pubMu.Unlock()
	if g.cfg.Encoding == EncodingDense32 && !g.enc.holds && f32.Within(delta, g.limit) {
		data, err := AppendDense(make([]byte, 0, headerSize+len(g.self)+4*len(delta)), g.self, step, g.cfg.ModelID, delta)
		if err != nil {
			return nil, fmt.Errorf("gossip: publish step %d: %w", step, err)
		}
		return &Message{step: step, data: data}, nil
	}
	u, err := g.enc.Encode(delta)
	if err != nil {
		return nil, fmt.Errorf("gossip: publish step %d: %w", step, err)
	}
	u.Sender, u.Step, u.ModelID = g.self, step, g.cfg.ModelID
	data, err := EncodeUpdate(nil, u)
	if err == nil && len(data) > g.cfg.MaxMessageSize {
		err = fmt.Errorf("encoded update is %d bytes, cap %d", len(data), g.cfg.MaxMessageSize)
	}
	if err != nil {
		g.enc.Restore(u)
		return nil, fmt.Errorf("gossip: publish step %d: %w", step, err)
	}
	return &Message{step: step, data: data, u: u, clamped: g.enc.Clamped()}, nil
}

// PublishEncoded publishes m, a message Encode made. If it cannot, what
// m carried is kept for the next message (error feedback).
func (g *Gossip) PublishEncoded(ctx context.Context, m *Message) error {
	if g.closed.Load() {
		g.restore(m)
		return ErrClosed
	}
	for {
		cur := g.step.Load()
		if m.step <= cur || g.step.CompareAndSwap(cur, m.step) {
			break
		}
	}
	if err := g.topic.Publish(ctx, m.data); err != nil {
		g.restore(m)
		return fmt.Errorf("gossip: publish step %d: %w", m.step, err)
	}
	g.stats.addSent(len(m.data), m.clamped)
	return nil
}

// restore keeps what m carried for the next message, when m went through
// the encoder (a message of the direct way is lost, as a lost message
// would be).
func (g *Gossip) restore(m *Message) {
	if m.u == nil {
		return
	}
	g.pubMu.Lock()
	g.enc.Restore(m.u)
	g.pubMu.Unlock()
}

// publishRaw publishes data on the topic as it is, unchecked. It exists for
// fault injection (internal/faults.PublishRaw): testnets use it to play
// peers that send malformed or hostile updates, so that the receivers'
// defences can be measured.
func (g *Gossip) publishRaw(ctx context.Context, data []byte) error {
	if g.closed.Load() {
		return ErrClosed
	}
	if err := g.topic.Publish(ctx, data); err != nil {
		return fmt.Errorf("gossip: publish raw: %w", err)
	}
	g.stats.addSent(len(data), 0)
	return nil
}

// validate is the topic validator: it runs on every message before GossipSub
// forwards or delivers it. Rejecting lowers the forwarding peer's score.
func (g *Gossip) validate(_ context.Context, from peer.ID, msg *pubsub.Message) pubsub.ValidationResult {
	if from == g.self {
		return pubsub.ValidationAccept // our own Publish: built and checked there
	}
	origin := msg.GetFrom()
	if origin == g.self {
		return pubsub.ValidationIgnore // our own message coming back: already applied
	}
	if g.cfg.drop != nil && g.cfg.drop() {
		return pubsub.ValidationIgnore
	}
	u, err := Validate(msg.GetData(), origin, g.step.Load(), g.lim)
	if err != nil {
		reason := ReasonOf(err)
		g.stats.addRejected(reason)
		g.log.Debug("update rejected", "reason", string(reason), "origin", origin, "from", from, "bytes", len(msg.GetData()), "err", err)
		if reason.Ignore() {
			return pubsub.ValidationIgnore
		}
		return pubsub.ValidationReject
	}
	msg.ValidatorData = u
	return pubsub.ValidationAccept
}

// receive is the receive goroutine: owned by g, stopped by Close.
func (g *Gossip) receive(ctx context.Context) {
	defer close(g.done)
	for {
		msg, err := g.sub.Next(ctx)
		if err != nil {
			return // Close cancelled ctx, or the subscription ended
		}
		if msg.GetFrom() == g.self {
			continue // read-my-writes: the sender applied its delta already
		}
		u, ok := takeUpdate(msg)
		if !ok {
			g.log.Error("update without validator data; dropped", "origin", msg.GetFrom())
			continue
		}
		g.stats.addReceived(u.WireSize)
		g.hmu.Lock()
		hs := g.handlers
		g.hmu.Unlock()
		for _, h := range hs {
			h.fn(*u)
		}
	}
}

// takeUpdate returns the update the validator decoded for msg, and drops
// it from msg: the router keeps the message for its gossip history (IHAVE,
// IWANT) for several heartbeats, and with it the decoded values, as large
// as the message, so what the history holds is then the wire bytes only.
func takeUpdate(msg *pubsub.Message) (*Update, bool) {
	u, ok := msg.ValidatorData.(*Update)
	msg.ValidatorData = nil
	return u, ok
}

// Close stops the receive goroutine, leaves the topic, unregisters the
// validator and the metrics, and stops the router if New started it. It waits
// for a running handler to return. Safe to call more than once.
func (g *Gossip) Close() error {
	g.closeOnce.Do(func() {
		g.closed.Store(true)
		g.closeErr = g.teardown()
	})
	return g.closeErr
}

func (g *Gossip) teardown() error {
	var errs []error
	if g.cancel != nil {
		g.cancel()
		<-g.done
	}
	if g.sub != nil {
		g.sub.Cancel()
	}
	if g.topic != nil {
		if err := g.topic.Close(); err != nil {
			errs = append(errs, fmt.Errorf("gossip: close topic: %w", err))
		}
	}
	if g.ps != nil {
		// Not registered if New failed early; that error is expected.
		_ = g.ps.UnregisterTopicValidator(g.name)
	}
	if g.ownPS != nil {
		g.ownPS()
		for _, p := range pubsub.GossipSubDefaultProtocols {
			g.h.RemoveStreamHandler(p)
		}
	}
	g.stats.unregister()
	return errors.Join(errs...)
}

var _ io.Closer = (*Gossip)(nil)
