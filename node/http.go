package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pspnode/pspnode/node/exchange"
	"github.com/pspnode/pspnode/node/netsetup"
	"github.com/pspnode/pspnode/overlay"
	"github.com/pspnode/pspnode/psp"
)

// Status is what /status reports.
type Status struct {
	PeerID             string   `json:"peer_id"`
	Addrs              []string `json:"addrs"`
	Job                string   `json:"job"`
	Barrier            string   `json:"barrier"`
	Step               int64    `json:"step"`
	PopulationEstimate float64  `json:"population_estimate"`
	EstimateStderr     float64  `json:"population_estimate_stderr"`
	EstimateError      string   `json:"population_estimate_error,omitempty"`
	RoutingTableSize   int      `json:"routing_table_size"`
	KnownPeers         int      `json:"known_peers"`
	ConnectedPeers     int      `json:"connected_peers"`
	// ConnectionsOpened counts connections opened since the node started,
	// inbound and outbound.
	ConnectionsOpened uint64 `json:"connections_opened"`
	// ConnectionsTrimmed counts the connections the node closed to hold
	// at most ConnHigh (connbound.go); StepDials the step queries that
	// had to dial (the peer was not connected).
	ConnectionsTrimmed uint64 `json:"connections_trimmed"`
	StepDials          uint64 `json:"step_dials"`
	Waiting            bool   `json:"waiting"`
	// Isolated: the node's last barrier check heard from no peer of the
	// job, so it waits at its barrier until one answers (node/isolation.go);
	// IsolatedSince is when that began (RFC 3339).
	Isolated      bool   `json:"isolated"`
	IsolatedSince string `json:"isolated_since,omitempty"`
	// Idle: a driven node without a trainer; its peers leave it out of
	// their barriers and population. Trainer names the trainer driving
	// it ("" for none).
	Idle          bool    `json:"idle,omitempty"`
	Trainer       string  `json:"trainer,omitempty"`
	UptimeS       float64 `json:"uptime_s"`
	StepIntervalS float64 `json:"step_interval_s"`
	// BarrierChecks counts barrier checks, BarrierPasses the checks that
	// let the node go on (one per step), BarrierWaitS the total time spent
	// at the barrier.
	BarrierChecks uint64  `json:"barrier_checks"`
	BarrierPasses uint64  `json:"barrier_passes"`
	BarrierWaitS  float64 `json:"barrier_wait_s"`
	OverlayReady  bool    `json:"overlay_ready"`
	SinceRefreshS float64 `json:"since_refresh_s"`
	// PoolInDegree is how many peers' sampler pools hold this node (their
	// samples draw it with weight pool size / in-degree); PoolRefused
	// counts malformed pool announcements refused.
	PoolInDegree int      `json:"pool_in_degree"`
	PoolRefused  int      `json:"pool_requests_refused"`
	Model        string   `json:"model,omitempty"`
	Loss         *float64 `json:"loss,omitempty"`
	Accuracy     *float64 `json:"accuracy,omitempty"`
	// Updates counts what the exchange carried: under gossip, updates
	// published and received on the topic; under epidemic, models sent to
	// peers (one per peer) and taken from them. Exchange details it.
	UpdatesSent     uint64          `json:"updates_sent"`
	UpdatesReceived uint64          `json:"updates_received"`
	UpdatesRejected uint64          `json:"updates_rejected"`
	Exchange        *exchange.Stats `json:"exchange,omitempty"`
	// Defences at work: step reports not counted at the barrier (stuck or
	// lying peers), received updates refused by the norm bound, inbound
	// streams reset at the per-peer cap.
	ReportsScreened    uint64 `json:"reports_screened"`
	UpdatesNormRefused uint64 `json:"updates_norm_refused"`
	StreamsRefused     uint64 `json:"streams_refused"`
	// StreamsRefusedBy splits StreamsRefused by protocol (step, model,
	// exchange): each has caps of its own.
	StreamsRefusedBy map[string]uint64 `json:"streams_refused_by_protocol"`
	// Lineage is the node's Genesis in hex ("" for none); ForksJoined
	// counts the times it left its lineage for an older one it met, and
	// PeersHeldOut the peers it holds out for running another model
	// (genesis.go).
	Lineage      string `json:"lineage,omitempty"`
	ForksJoined  uint64 `json:"forks_joined"`
	PeersHeldOut int    `json:"peers_held_out"`
	// JoinStatus says whether the node has joined, and if not why.
	overlay.JoinStatus
	// Traffic is what the node's streams carried, by protocol class.
	Traffic Traffic `json:"traffic"`
	// NAT is the node's reachability, relay addresses and connections by
	// kind (netsetup/nat.go).
	NAT netsetup.NATStatus `json:"nat"`
}

// Status returns the node's current status.
func (n *Node) Status() Status {
	st := Status{
		PeerID:            n.h.ID().String(),
		Job:               n.cfg.Job,
		Barrier:           n.cfg.Barrier.String(),
		Step:              n.step.Load(),
		ConnectedPeers:    len(n.h.Network().Peers()),
		ConnectionsOpened: n.opened.Load(),
		Waiting:           n.waiting.Load(),
		Idle:              n.idle.Load(),
		UptimeS:           time.Since(n.started).Seconds(),
		StepIntervalS:     n.stepInterval(),
		JoinStatus:        n.ov.JoinStatus(),
	}
	for _, a := range n.Addrs() {
		st.Addrs = append(st.Addrs, a.String())
	}
	if n.driver != nil {
		st.Trainer = n.driver.clientName()
	}
	if since := n.isolatedSince(); !since.IsZero() {
		st.Isolated, st.IsolatedSince = true, since.UTC().Format(time.RFC3339)
	}
	// The population the node uses (its learning rate's), which is never
	// below itself and the live peers it knows: 1 for a node alone. The
	// error says why the estimators have none (the figure is then that
	// count), the stderr is theirs.
	st.PopulationEstimate = n.population()
	if _, se, err := n.ov.Estimate(); err != nil {
		st.EstimateError = err.Error()
	} else {
		st.EstimateStderr = se
	}
	os := n.ov.Status()
	st.RoutingTableSize, st.KnownPeers = os.RoutingTableSize, os.Members
	st.OverlayReady, st.SinceRefreshS = os.Ready, os.SinceRefresh.Seconds()
	st.PoolInDegree, st.PoolRefused = os.InDegree, os.MalformedPool
	if ev := n.lastEval.Load(); ev != nil {
		loss, acc := ev.Loss, ev.Accuracy
		st.Loss = &loss
		if acc == acc { // not NaN (regression models have no accuracy)
			st.Accuracy = &acc
		}
	}
	if n.modelUp.Load() {
		us := n.UpdateStats()
		st.UpdatesSent, st.UpdatesReceived, st.UpdatesRejected = us.Sent, us.Received, us.TotalRejected()
		x := n.exchangeStats()
		st.Exchange = &x
	}
	for _, v := range []psp.Verdict{psp.Stuck, psp.Regressed, psp.Quarantined} {
		st.ReportsScreened += uint64(counterValue(n.m.screened.WithLabelValues(v.String())))
	}
	st.UpdatesNormRefused = uint64(counterValue(n.m.normRefused))
	st.StreamsRefusedBy = make(map[string]uint64, len(refusedProtocols))
	for _, p := range refusedProtocols {
		v := uint64(counterValue(n.m.refused.WithLabelValues(p)))
		st.StreamsRefusedBy[p] = v
		st.StreamsRefused += v
	}
	st.BarrierChecks = uint64(counterValue(n.m.checks))
	st.ConnectionsTrimmed = uint64(counterValue(n.m.connsTrimmed))
	st.StepDials = uint64(counterValue(n.m.stepDials))
	st.BarrierWaitS, st.BarrierPasses = histogramSum(n.m.wait)
	st.Traffic = n.Traffic()
	st.NAT = n.NAT()
	st.Lineage, st.ForksJoined, st.PeersHeldOut = n.lin.Own().String(), uint64(counterValue(n.lin.Converged)), n.ov.HeldOutCount()
	if mt, ok := n.task.(interface{ ModelName() string }); ok {
		st.Model = mt.ModelName() // the built-in tasks' (package builtin)
	}
	return st
}

// Handler serves /metrics (Prometheus text format: the psp_* metrics, the
// gossip counters and go-libp2p's own), /status (JSON) and /health (200
// once the node has joined, 503 and the reason before, or while it is
// isolated).
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(n.Status())
	})
	mux.HandleFunc("/health", n.serveHealth)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "pspnode: see /status and /metrics")
	})
	return mux
}

// HTTPServer serves Handler on one address. Close stops it.
type HTTPServer struct {
	srv *http.Server
	ln  net.Listener
	err chan error // Serve's result, sent once

	closeOnce sync.Once
	closeErr  error
}

// ServeHTTP starts serving the node's /metrics and /status on addr
// ("127.0.0.1:9090", or port 0 for any free port).
func (n *Node) ServeHTTP(addr string) (*HTTPServer, error) {
	return serveHTTP(addr, n.Handler())
}

func serveHTTP(addr string, h http.Handler) (*HTTPServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	s := &HTTPServer{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second},
		ln:  ln,
		err: make(chan error, 1),
	}
	go func() { s.err <- s.srv.Serve(ln) }() // ends when Close shuts the server down
	return s, nil
}

// Addr is the address the server listens on.
func (s *HTTPServer) Addr() net.Addr { return s.ln.Addr() }

// Close shuts the server down, waiting up to 2 s for requests in flight.
// It is safe to call more than once: later calls return the first's result.
func (s *HTTPServer) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := s.srv.Shutdown(ctx)
		if serr := <-s.err; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		s.closeErr = err
	})
	return s.closeErr
}

// serveHealth answers 200 once the node has joined, 503 with the reason
// before, and while it is isolated (isolation.go): a readiness probe.
func (n *Node) serveHealth(w http.ResponseWriter, _ *http.Request) {
	st := n.ov.JoinStatus()
	if !st.Joined {
		http.Error(w, "not joined: "+st.JoinError, http.StatusServiceUnavailable)
		return
	}
	if why := n.isolatedReason(); why != "" {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "joined")
}
