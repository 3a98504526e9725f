package trainer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"

	"github.com/pspnode/pspnode/node"
	pb "github.com/pspnode/pspnode/node/trainer/trainerpb"
)

// Config configures a Server. Start from DefaultConfig.
type Config struct {
	// Listen is where trainers connect: "unix:PATH" (a Unix socket, mode
	// 0600, created at PATH; a stale socket there is replaced) or
	// "tcp:HOST:PORT" with a loopback HOST (port 0: any free port).
	Listen string
	// MaxMessageBytes caps one message on the socket either way; a larger
	// one closes that call with an error. It bounds the model a trainer
	// without shared memory can use (4 bytes per parameter).
	MaxMessageBytes int
	// SharedMemory offers trainers on this machine a shared file for
	// tensors (Linux), so that no copy of a vector crosses the socket.
	SharedMemory bool
	// SharedDir is where shared files are made ("" : /dev/shm, or the
	// temporary directory without it).
	SharedDir string
	// ParamsTimeout bounds the wait for the trainer's parameters when a
	// peer fetches the model.
	ParamsTimeout time.Duration
	// MaxConns caps the connections the socket holds at once (one trainer
	// drives the node; others may wait for it to go). A connection over
	// the cap is told why, in an HTTP/2 GOAWAY that a gRPC client reports,
	// and closed.
	MaxConns int
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the server's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a configuration for a trainer on this machine:
// messages up to 256 MiB, shared memory on.
func DefaultConfig() Config {
	return Config{
		MaxMessageBytes: 256 << 20,
		SharedMemory:    true,
		ParamsTimeout:   5 * time.Second,
		MaxConns:        16,
	}
}

// Server is a driven node's trainer API: a gRPC server on a local socket
// through which one trainer at a time drives the node (see the package
// comment and proto/pspnode/trainer/v3/trainer.proto).
type Server struct {
	pb.UnimplementedTrainerServer
	cfg  Config
	node *node.Node
	drv  *node.Driver
	task *RemoteModel
	log  *slog.Logger
	m    *metrics
	ln   net.Listener
	addr string
	gs   *grpc.Server
	unix string // the socket's path, removed at Close

	stm        *stateMetrics // the trainer-state protocol (state.go)
	stateLimit *stateLimits
	stateProto protocol.ID

	mu     sync.Mutex
	sess   *session // the connected trainer's, nil for none
	closed bool
	served chan error

	closeOnce sync.Once
}

// New starts serving the trainer API of nd, a driven node built with
// task (node.Config.Driven, node.WithModel(task)), on cfg.Listen.
func New(nd *node.Node, task *RemoteModel, cfg Config) (*Server, error) {
	drv, err := nd.Driver()
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	if nd.Model() != node.Model(task) {
		return nil, errors.New("trainer: the node's model is not this RemoteModel")
	}
	if cfg.MaxMessageBytes <= 0 {
		return nil, fmt.Errorf("trainer: MaxMessageBytes must be positive (got %d)", cfg.MaxMessageBytes)
	}
	if cfg.ParamsTimeout <= 0 {
		return nil, fmt.Errorf("trainer: ParamsTimeout must be positive (got %v)", cfg.ParamsTimeout)
	}
	if cfg.MaxConns <= 0 {
		return nil, fmt.Errorf("trainer: MaxConns must be positive (got %d)", cfg.MaxConns)
	}
	if cfg.SharedDir == "" {
		cfg.SharedDir = defaultSharedDir()
	}
	s := &Server{cfg: cfg, node: nd, drv: drv, task: task, log: cfg.Logger, served: make(chan error, 1)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "trainer-api")
	s.m = newMetrics(cfg.Registerer)
	task.stepNow = func() int64 { return nd.Step() }
	if s.ln, s.unix, err = listen(cfg.Listen); err != nil {
		return nil, err
	}
	s.addr = cfg.Listen
	if s.unix == "" {
		s.addr = "tcp:" + s.ln.Addr().String()
	}
	s.ln = capConns(s.ln, cfg.MaxConns, s.log, cfg.Registerer)
	if cfg.SharedMemory && sharedMemorySupported {
		if k := removeStaleShared(cfg.SharedDir); k > 0 {
			s.log.Info("removed shared files left by daemons that are gone", "files", k, "dir", cfg.SharedDir)
		}
	}
	s.startState(cfg.Registerer)
	s.gs = grpc.NewServer(
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		// A trainer waits at barriers for as long as they take; the
		// connection itself is watched by the kernel (a Unix socket, or
		// loopback TCP, closes when the process ends).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.UnknownServiceHandler(unknownService), // a version 1 client is told to upgrade (errors.go)
	)
	pb.RegisterTrainerServer(s.gs, s)
	go func() { s.served <- s.gs.Serve(s.ln) }() // ends at Close (Stop)
	return s, nil
}

// listen opens the socket of addr.
func listen(addr string) (ln net.Listener, unixPath string, err error) {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		path := strings.TrimPrefix(addr, "unix:")
		if path == "" {
			return nil, "", errors.New("trainer: unix: needs a path, e.g. unix:/tmp/pspnode.sock")
		}
		if err := removeStaleSocket(path); err != nil {
			return nil, "", err
		}
		ln, err = net.Listen("unix", path)
		if err != nil {
			return nil, "", fmt.Errorf("trainer: listen on %s: %w", addr, err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(true)
		// Only this user's processes may drive the node. (Connecting
		// needs write permission; the usual umask already denies it to
		// others, and this makes it so whatever the umask.)
		if err := os.Chmod(path, 0o600); err != nil {
			ln.Close()
			return nil, "", fmt.Errorf("trainer: %w", err)
		}
		return ln, path, nil
	case strings.HasPrefix(addr, "tcp:"):
		hostPort := strings.TrimPrefix(addr, "tcp:")
		host, _, err := net.SplitHostPort(hostPort)
		if err != nil {
			return nil, "", fmt.Errorf("trainer: %q: want tcp:HOST:PORT, e.g. tcp:127.0.0.1:7000: %w", addr, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, "", fmt.Errorf("trainer: %q: the trainer API has no authentication; listen on a loopback address (127.0.0.1, ::1) or a Unix socket", addr)
		}
		ln, err = net.Listen("tcp", hostPort)
		if err != nil {
			return nil, "", fmt.Errorf("trainer: listen on %s: %w", addr, err)
		}
		return ln, "", nil
	}
	return nil, "", fmt.Errorf("trainer: %q: want unix:PATH or tcp:127.0.0.1:PORT", addr)
}

// CheckListen says whether a server could listen on addr (Config.Listen):
// the form, a loopback host, a directory that exists, no other daemon on
// the socket or port. It leaves nothing behind (a stale socket file stays
// for New to replace), so that a command can refuse a bad address before
// it starts anything.
func CheckListen(addr string) error {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		path := strings.TrimPrefix(addr, "unix:")
		if path == "" {
			return errors.New("trainer: unix: needs a path, e.g. unix:/tmp/pspnode.sock")
		}
		if _, err := os.Stat(filepath.Dir(path)); err != nil {
			return fmt.Errorf("trainer: socket directory: %w", err)
		}
		if st, err := os.Lstat(path); err == nil {
			if st.Mode()&os.ModeSocket == 0 {
				return fmt.Errorf("trainer: %s exists and is not a socket; choose another path", path)
			}
			if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
				c.Close()
				return fmt.Errorf("trainer: another daemon listens on %s", path)
			}
		}
		return nil
	case strings.HasPrefix(addr, "tcp:"):
		ln, _, err := listen(addr)
		if err != nil {
			return err
		}
		return ln.Close()
	}
	return fmt.Errorf("trainer: %q: want unix:PATH or tcp:127.0.0.1:PORT", addr)
}

// removeStaleSocket removes a socket file at path that nothing listens on
// (a daemon that was killed), and refuses if a daemon is still there or
// the path is something else.
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		if dir := filepath.Dir(path); dir != "" {
			if _, err := os.Stat(dir); err != nil {
				return fmt.Errorf("trainer: socket directory: %w", err)
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("trainer: %w", err)
	}
	if st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("trainer: %s exists and is not a socket; choose another path", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("trainer: another daemon listens on %s", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("trainer: remove the stale socket: %w", err)
	}
	return nil
}

// Addr is where trainers connect, in the form of Config.Listen (with the
// port a tcp:HOST:0 listener got).
func (s *Server) Addr() string { return s.addr }

// Close ends the trainer's session, if any, and stops serving. The node
// is left as it is (Deactivated).
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		sess := s.sess
		s.mu.Unlock()
		if sess != nil {
			sess.cancel(errors.New("the daemon is stopping"))
		}
		s.stopState()
		s.gs.Stop()
		if serr := <-s.served; serr != nil && !errors.Is(serr, grpc.ErrServerStopped) {
			err = serr
		}
		if sess != nil {
			<-sess.done
		}
	})
	return err
}

// active returns the session with this id, or an error for the trainer.
func (s *Server) active(id string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil || s.sess.id != id || id == "" {
		return nil, errNoSession
	}
	return s.sess, nil
}

// capConns wraps ln so that it holds at most max connections at once:
// Accept tells each one over the cap why (refuse) and closes it. Idle
// connections to the socket were held without bound: 2 000 were. Close
// closes the connections it holds too: gRPC's Stop waited for each
// connection that had not sent its preface (up to 2 minutes), so a
// daemon with idle connections on its socket took that long to stop.
func capConns(ln net.Listener, max int, log *slog.Logger, reg prometheus.Registerer) *cappedListener {
	l := &cappedListener{Listener: ln, slots: make(chan struct{}, max), refusing: make(chan struct{}, maxRefusing),
		live: make(map[*cappedConn]struct{}), log: log,
		refusedTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "psp", Subsystem: "trainer", Name: "connections_refused_total",
			Help: "Connections to the trainer socket refused because it held its cap (Config.MaxConns) of connections."})}
	if reg != nil {
		reg.MustRegister(l.refusedTotal)
	}
	return l
}

type cappedListener struct {
	net.Listener
	slots        chan struct{} // one per connection held
	refusing     chan struct{} // one per refusal under way
	wg           sync.WaitGroup
	log          *slog.Logger
	refusedTotal prometheus.Counter

	mu       sync.Mutex
	live     map[*cappedConn]struct{} // the connections held
	closed   bool
	refused  int       // connections refused since lastWarn
	lastWarn time.Time // when a refusal was last logged
}

const (
	// refuseLinger bounds a refusal: the write of the GOAWAY, then the
	// wait for the client to read it and close.
	refuseLinger = time.Second
	// maxRefusing bounds the refusals under way; a connection over both
	// caps is closed without a word.
	maxRefusing = 64
)

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
		default:
			l.refuse(c)
			continue
		}
		cc := &cappedConn{Conn: c}
		cc.release = sync.OnceFunc(func() {
			l.mu.Lock()
			delete(l.live, cc)
			l.mu.Unlock()
			<-l.slots
		})
		l.mu.Lock()
		closed := l.closed
		if !closed {
			l.live[cc] = struct{}{}
		}
		l.mu.Unlock()
		if closed {
			_ = c.Close()
			<-l.slots
			return nil, net.ErrClosed
		}
		return cc, nil
	}
}

// Close closes the listener and the connections it holds, and waits for
// the refusals under way (at most refuseLinger).
func (l *cappedListener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	live := make([]*cappedConn, 0, len(l.live))
	for c := range l.live {
		live = append(live, c)
	}
	l.mu.Unlock()
	for _, c := range live {
		_ = c.Close()
	}
	l.wg.Wait()
	return err
}

// refuse tells c, in the background, that the socket holds too many
// connections, and closes it; it logs refusals at most once per 10 s with
// their count since.
func (l *cappedListener) refuse(c net.Conn) {
	l.refusedTotal.Inc()
	l.mu.Lock()
	l.refused++
	now := time.Now()
	warn := now.Sub(l.lastWarn) >= 10*time.Second
	k := l.refused
	if warn {
		l.lastWarn, l.refused = now, 0
	}
	l.mu.Unlock()
	if warn {
		l.log.Warn("refused connections to the trainer socket: it holds its cap of connections", "refused", k, "cap", cap(l.slots))
	}
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	msg := fmt.Sprintf("pspnode trainer API: too many connections (the socket holds its cap of %d): close idle connections to it, "+
		"or start another `pspnode run --trainer` for another trainer", cap(l.slots))
	l.wg.Go(func() {
		defer func() { <-l.refusing }()
		tellAndClose(c, msg)
	})
}

// tellAndClose answers a gRPC client on c, within refuseLinger, with
// msg: the first call it opens ends at once with status
// RESOURCE_EXHAUSTED and msg (a trailers-only response, which every gRPC
// client reports as the call's error), then a GOAWAY carrying msg too
// (what a client that is not gRPC can read). A connection that sends no
// HTTP/2 preface in that time gets the GOAWAY alone. Then c is closed.
func tellAndClose(c net.Conn, msg string) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseLinger))
	fr := http2.NewFramer(c, c)
	goAway := func(lastStream uint32) {
		_ = fr.WriteGoAway(lastStream, http2.ErrCodeEnhanceYourCalm, []byte(msg))
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, c) // until the client closes, or the deadline
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		if fr.WriteSettings() == nil {
			goAway(0)
		}
		return
	}
	if fr.WriteSettings() != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.HeadersFrame:
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, hf := range []hpack.HeaderField{
				{Name: ":status", Value: "200"},
				{Name: "content-type", Value: "application/grpc"},
				{Name: "grpc-status", Value: strconv.Itoa(int(codes.ResourceExhausted))},
				{Name: "grpc-message", Value: msg}, // printable ASCII without '%': no escaping
			} {
				_ = enc.WriteField(hf)
			}
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}) == nil {
				goAway(f.StreamID)
			}
			return
		}
	}
}

// cappedConn frees its slot when closed.
type cappedConn struct {
	net.Conn
	release func()
}

func (c *cappedConn) Close() error {
	c.release()
	return c.Conn.Close()
}
