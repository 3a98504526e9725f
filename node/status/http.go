package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics (reg's in Prometheus text format: a node's are the psp_*
// metrics, the gossip counters and go-libp2p's own), /status (src.Status as JSON) and /health (200,
// or 503 and src.Health's reason).
// A Source is what the handler shows: a node.
type Source interface {
	Status() Status
	// Health is "" when the node is ready, else why not.
	Health() string
}

func Handler(src Source, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(src.Status())
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		if why := src.Health(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "joined")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "pspnode: see /status and /metrics")
	})
	return mux
}

// Server serves a handler on one address. Close stops it.
type Server struct {
	srv *http.Server
	ln  net.Listener
	err chan error // Serve's result, sent once

	closeOnce sync.Once
	closeErr  error
}

// Serve starts serving h (a node's Handler) on addr ("127.0.0.1:9090",
// or port 0 for any free port).
func Serve(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("http: %w", err)
	}
	return ServeOn(ln, h), nil
}

// ServeOn serves h on ln, which the server then owns (Close closes it).
func ServeOn(ln net.Listener, h http.Handler) *Server {
	s := &Server{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second},
		ln:  ln,
		err: make(chan error, 1),
	}
	go func() { s.err <- s.srv.Serve(ln) }() // ends when Close shuts the server down
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close shuts the server down, waiting up to 2 s for requests in flight.
// It is safe to call more than once: later calls return the first's result.
func (s *Server) Close() error {
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
