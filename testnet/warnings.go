package testnet

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// warnCounter is a slog handler that counts the records at Warn and above
// (and the bytes they take as text) before passing them on to next.
type warnCounter struct {
	next  slog.Handler
	lines *atomic.Uint64
	bytes *atomic.Uint64
}

func (w warnCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || w.next.Enabled(ctx, l)
}

func (w warnCounter) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.lines.Add(1)
		var cw countWriter
		_ = slog.NewTextHandler(&cw, nil).Handle(ctx, r)
		w.bytes.Add(uint64(cw))
	}
	if w.next.Enabled(ctx, r.Level) {
		return w.next.Handle(ctx, r)
	}
	return nil
}

func (w warnCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return warnCounter{next: w.next.WithAttrs(as), lines: w.lines, bytes: w.bytes}
}

func (w warnCounter) WithGroup(g string) slog.Handler {
	return warnCounter{next: w.next.WithGroup(g), lines: w.lines, bytes: w.bytes}
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }
