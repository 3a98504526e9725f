package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/libp2p/go-libp2p/gologshim"
)

// go-libp2p builds its host with uber's fx, whose logger (go-libp2p's
// config.(*Config).addTransports: the "p2p-config" logger with
// system=fx) logs every failure of the host's start three times at error
// level ("OnStart hook failed", "start failed, rolling back", "start
// failed") before libp2p.New returns the same error, which pspnode then
// prints naming its flag. Those three lines are noise in front of the
// message that matters, so pspnode gives go-libp2p's loggers (through
// gologshim, before any of them first logs) a handler that drops fx's
// error records and is otherwise what gologshim would build on its own:
// levels per subsystem from GOLOG_LOG_LEVEL (error by default), text or
// JSON from GOLOG_LOG_FORMAT, sources unless GOLOG_LOG_ADD_SOURCE=false,
// on stderr.
func init() {
	gologshim.SetDefaultHandler(newLibp2pHandler(libp2pOutput()))
}

// libp2pOutput is the handler go-libp2p's records go to when enabled.
func libp2pOutput() slog.Handler {
	addSource := true
	if v := os.Getenv("GOLOG_LOG_ADD_SOURCE"); v == "0" || v == "false" {
		addSource = false
	}
	opts := &slog.HandlerOptions{
		Level:     slog.LevelDebug, // libp2pHandler decides
		AddSource: addSource,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey:
				a.Key = "ts" // go-log's name, as gologshim writes it
			case slog.LevelKey:
				if l, ok := a.Value.Any().(slog.Level); ok {
					a.Value = slog.StringValue(map[slog.Level]string{
						slog.LevelDebug: "debug", slog.LevelInfo: "info", slog.LevelWarn: "warn", slog.LevelError: "error",
					}[l])
				}
			}
			return a
		},
	}
	format := os.Getenv("GOLOG_LOG_FORMAT")
	if format == "" {
		format = os.Getenv("GOLOG_LOG_FMT")
	}
	if format == "json" {
		return slog.NewJSONHandler(os.Stderr, opts)
	}
	return slog.NewTextHandler(os.Stderr, opts)
}

// libp2pHandler is the handler of one go-libp2p logger. gologshim gives
// it the logger's subsystem as the attribute logger=NAME, and fx's logger
// adds system=fx.
type libp2pHandler struct {
	out    slog.Handler
	level  slog.Level // the subsystem's level
	system string     // the subsystem, once known
	fx     bool       // go-libp2p's fx logger
}

func newLibp2pHandler(out slog.Handler) *libp2pHandler {
	return &libp2pHandler{out: out, level: gologshim.ConfigFromEnv().LevelForSystem("")}
}

func (h *libp2pHandler) Enabled(ctx context.Context, l slog.Level) bool {
	if h.fx && l >= slog.LevelError {
		return false // repeats the error libp2p.New returns
	}
	return l >= h.level && h.out.Enabled(ctx, l)
}

func (h *libp2pHandler) Handle(ctx context.Context, r slog.Record) error {
	if !h.Enabled(ctx, r.Level) {
		return nil
	}
	return h.out.Handle(ctx, r)
}

func (h *libp2pHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	for _, a := range attrs {
		switch {
		case a.Key == "logger" && c.system == "":
			c.system = a.Value.String()
			c.level = gologshim.ConfigFromEnv().LevelForSystem(c.system)
		case a.Key == "system" && a.Value.String() == "fx" && c.system == "p2p-config":
			c.fx = true
		}
	}
	c.out = h.out.WithAttrs(attrs)
	return &c
}

func (h *libp2pHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.out = h.out.WithGroup(name)
	return &c
}
