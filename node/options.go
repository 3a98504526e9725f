package node

import (
	"errors"
	"log/slog"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/prometheus/client_golang/prometheus"
)

// An Option hands New something the node runs with: a host, a task, a
// logger, a metrics registry. Config holds the node's settings (data, which
// Validate can check and a flag can set); options hold the live objects it
// uses. Each has a default when left out.
type Option func(*deps)

// deps are a node's runtime dependencies, as the options set them.
type deps struct {
	events chan<- Event
	host   host.Host
	task   Task
	model  Model
	log    *slog.Logger
	reg    *prometheus.Registry
}

// WithHost has the node use h instead of building a host (testnets pass
// in-memory hosts). The node owns h from the moment New is called: New
// closes it if it fails, for whatever reason (Validate's included), and
// Close (or Leave) closes it otherwise; the caller must not close it
// or use it for anything else. The node counts the bytes of the streams
// it opens and accepts through it (Traffic). With a host, Config's
// Listen, Identity, ConnLow, ConnHigh, NAT and UserAgent are not used,
// and PSK and AllowPeers must be empty (they need a host the node builds).
func WithHost(h host.Host) Option { return func(d *deps) { d.host = h } }

// WithTask sets the work of a step, for a node that runs its own steps
// (Run). Without it a node's steps do no work and publish nothing.
func WithTask(t Task) Option { return func(d *deps) { d.task = t } }

// WithModel sets the model of a driven node (Config.Driven), whose program
// computes the steps: it needs a Model, no Task.
func WithModel(m Model) Option { return func(d *deps) { d.model = m } }

// WithEvents has the node send ch its Events: peers met, left and
// failed, steps taken, isolation begun and ended. The node never waits on
// ch: an event that finds it full is dropped (and counted), so give it
// room (a buffer of a few hundred) and read it promptly. The node does
// not close ch.
func WithEvents(ch chan<- Event) Option { return func(d *deps) { d.events = ch } }

// WithLogger sets where the node's logs go (and the overlay's and gossip's,
// unless Config.Overlay.Logger or Config.Gossip.Logger is set). Without it
// they are discarded.
func WithLogger(l *slog.Logger) Option { return func(d *deps) { d.log = l } }

// WithRegistry sets the registry the node's metrics go to (and those of
// the host it builds, and gossip's). Without it the node makes a private
// one; Node.Registry returns either.
func WithRegistry(r *prometheus.Registry) Option { return func(d *deps) { d.reg = r } }

// validate checks what the options and the configuration must agree on.
func (d deps) validate(c Config) []error {
	var errs []error
	switch {
	case c.Driven && d.model == nil:
		errs = append(errs, errors.New("WithModel: a driven node (Driven) needs the driving program's model"))
	case c.Driven && d.task != nil:
		errs = append(errs, errors.New("WithTask: a driven node (Driven) runs no task of its own: give its model with WithModel"))
	case !c.Driven && d.model != nil:
		errs = append(errs, errors.New("WithModel: only a driven node (Driven) takes a bare model; a node that runs its own steps takes a Task (WithTask)"))
	}
	if d.host == nil && len(c.Listen) == 0 {
		errs = append(errs, errors.New("Listen: no listen address, and no host (WithHost)"))
	}
	if d.host != nil && (len(c.PSK) > 0 || len(c.AllowPeers) > 0) {
		errs = append(errs, errors.New("PSK, AllowPeers: a swarm key or an allowlist needs a host the node builds, not one given with WithHost"))
	}
	return errs
}
