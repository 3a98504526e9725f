package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"time"
)

// LinkStats is what MeasureLink measured between two hosts.
type LinkStats struct {
	// RTTs are the TCP round trips of one-byte messages, one per ping,
	// in the order sent.
	RTTs []time.Duration
	// Bytes is the bulk transfer's size; Rate its rate in bytes per
	// second over its second half (past TCP's slow start), RateAll over
	// the whole transfer from the first byte received.
	Bytes         int64
	Rate, RateAll float64
}

// RTT is the q-quantile of the round trips (q in [0, 1]; 0.5 the median).
func (s LinkStats) RTT(q float64) time.Duration {
	if len(s.RTTs) == 0 {
		return 0
	}
	r := slices.Clone(s.RTTs)
	slices.Sort(r)
	return r[min(len(r)-1, int(q*float64(len(r)-1)+0.5))]
}

// String is a line for a person: round trips and rates.
func (s LinkStats) String() string {
	return fmt.Sprintf("TCP round trip min %s, median %s, p90 %s (%d pings); %s in %.0f Mbit/s (whole transfer %.0f Mbit/s)",
		ms(s.RTT(0)), ms(s.RTT(0.5)), ms(s.RTT(0.9)), len(s.RTTs), mb(s.Bytes), s.Rate*8/1e6, s.RateAll*8/1e6)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + " ms"
}

func mb(b int64) string { return strconv.FormatFloat(float64(b)/1e6, 'f', 1, 64) + " MB" }

// MeasureLink measures the path from host a to host b with TCP: pings
// one-byte round trips (each sent after the last came back), then a bulk
// transfer of bulk bytes from a to b (none if bulk is 0). Every wait has
// ctx's deadline, or a minute.
func MeasureLink(ctx context.Context, a, b *Host, pings int, bulk int64) (LinkStats, error) {
	var st LinkStats
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	ln, err := b.Listen("tcp", net.JoinHostPort(b.IP.String(), "0"))
	if err != nil {
		return st, err
	}
	defer ln.Close()
	addr := ln.Addr().String()
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 2)
	go func() { // ends when ln closes or two connections came
		for range 2 {
			c, err := ln.Accept()
			acc <- accepted{c, err}
			if err != nil {
				return
			}
		}
	}()
	dial := func() (net.Conn, net.Conn, error) {
		c, err := a.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("netns: dial %s from %s: %w", addr, a.NS, err)
		}
		select {
		case r := <-acc:
			if r.err != nil {
				c.Close()
				return nil, nil, r.err
			}
			_ = c.SetDeadline(deadline)
			_ = r.c.SetDeadline(deadline)
			return c, r.c, nil
		case <-time.After(time.Until(deadline)):
			c.Close()
			return nil, nil, errors.New("netns: no connection accepted")
		}
	}
	// Pings: b echoes every byte.
	c, s, err := dial()
	if err != nil {
		return st, err
	}
	echoed := make(chan error, 1)
	go func() { // ends when c closes (s reads EOF) or the deadline passes
		_, err := io.Copy(s, s)
		s.Close()
		echoed <- err
	}()
	one := []byte{1}
	for range pings {
		t := time.Now()
		if _, err := c.Write(one); err != nil {
			c.Close()
			return st, fmt.Errorf("netns: ping: %w", err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			c.Close()
			return st, fmt.Errorf("netns: ping: %w", err)
		}
		st.RTTs = append(st.RTTs, time.Since(t))
	}
	c.Close()
	if err := <-echoed; err != nil {
		return st, fmt.Errorf("netns: echo: %w", err)
	}
	if bulk <= 0 {
		return st, nil
	}
	// Bulk: a sends, b times the second half of what it reads.
	c, s, err = dial()
	if err != nil {
		return st, err
	}
	type timed struct {
		n, nHalf    int64
		first, half time.Time
		end         time.Time
		err         error
	}
	got := make(chan timed, 1)
	go func() { // ends at EOF or the deadline
		defer s.Close()
		var r timed
		buf := make([]byte, 256<<10)
		for {
			k, err := s.Read(buf)
			if k > 0 {
				if r.n == 0 {
					r.first = time.Now()
				}
				r.n += int64(k)
				if r.half.IsZero() && r.n >= bulk/2 {
					r.half, r.nHalf = time.Now(), r.n
				}
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					r.err = err
				}
				r.end = time.Now()
				got <- r
				return
			}
		}
	}()
	buf := make([]byte, 256<<10)
	for sent := int64(0); sent < bulk; {
		k := min(int64(len(buf)), bulk-sent)
		if _, err := c.Write(buf[:k]); err != nil {
			c.Close()
			return st, fmt.Errorf("netns: bulk: %w", err)
		}
		sent += k
	}
	c.Close()
	r := <-got
	if r.err != nil || r.n != bulk {
		return st, fmt.Errorf("netns: bulk: %d of %d bytes arrived: %v", r.n, bulk, r.err)
	}
	st.Bytes = bulk
	st.Rate = float64(bulk-r.nHalf) / max(r.end.Sub(r.half).Seconds(), 1e-9)
	st.RateAll = float64(bulk) / max(r.end.Sub(r.first).Seconds(), 1e-9)
	return st, nil
}
