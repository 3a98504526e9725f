package trainer

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
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
	}
}

// Server is a driven node's trainer API: a gRPC server on a local socket
// through which one trainer at a time drives the node (see the package
// comment and proto/pspnode/trainer/v2/trainer.proto).
type Server struct {
	pb.UnimplementedTrainerServer
	cfg  Config
	node *node.Node
	drv  *node.Driver
	task *Task
	log  *slog.Logger
	m    *metrics
	ln   net.Listener
	addr string
	gs   *grpc.Server
	unix string // the socket's path, removed at Close

	stm        *stateMetrics // the trainer-state protocol (state.go)
	stateProto protocol.ID

	mu     sync.Mutex
	sess   *session // the connected trainer's, nil for none
	closed bool
	served chan error

	closeOnce sync.Once
}

// New starts serving the trainer API of nd, a driven node built with
// task (node.Config.Driven, node.WithTask(task)), on cfg.Listen.
func New(nd *node.Node, task *Task, cfg Config) (*Server, error) {
	drv, err := nd.Driver()
	if err != nil {
		return nil, fmt.Errorf("trainer: %w", err)
	}
	if nd.Task() != task {
		return nil, errors.New("trainer: the node's task is not this Task")
	}
	if cfg.MaxMessageBytes <= 0 {
		return nil, fmt.Errorf("trainer: MaxMessageBytes must be positive (got %d)", cfg.MaxMessageBytes)
	}
	if cfg.ParamsTimeout <= 0 {
		return nil, fmt.Errorf("trainer: ParamsTimeout must be positive (got %v)", cfg.ParamsTimeout)
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
