package netns

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// lswitch is a run's switch between its linked hosts' TAPs. One loop on
// one OS thread does all its work: it waits in epoll for a TAP to have a
// frame or its timer to fire, reads frames and queues them at their
// destinations for the source link's delay plus the destination link's,
// and writes each when due, the timer (a timerfd, to the microsecond) set
// for the earliest. One thread and no goroutine hand-offs keep the cost
// per frame to a few system calls; the thread's CPU time is the switch's,
// receiving kernels' work in the TAP writes included.
type lswitch struct {
	mu      sync.Mutex
	pending []*port // attached, not yet taken by the loop
	closed  bool

	epfd, tfd, evfd int
	done            chan struct{} // closed when the loop has ended

	frames, bytes, dropped, errors atomic.Int64
	cpu                            atomic.Int64 // the loop thread's CPU, ns
}

func newSwitch() (*lswitch, error) {
	s := &lswitch{epfd: -1, tfd: -1, evfd: -1, done: make(chan struct{})}
	var err error
	if s.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err == nil {
		if s.tfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err == nil {
			s.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		}
	}
	for _, fd := range []int{s.tfd, s.evfd} {
		if err == nil {
			err = unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
		}
	}
	if err != nil {
		s.closeFDs()
		return nil, fmt.Errorf("netns: switch: %w", err)
	}
	go s.loop() // ends when close signals it
	return s, nil
}

// attach puts a TAP on the switch behind a link of delay d.
func (s *lswitch) attach(tap *tapDevice, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		unix.Close(tap.fd)
		return errors.New("netns: closed")
	}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, tap.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(tap.fd)}); err != nil {
		unix.Close(tap.fd)
		return fmt.Errorf("netns: switch: %w", err)
	}
	s.pending = append(s.pending, &port{fd: tap.fd, name: tap.name, delay: d})
	s.kick()
	return nil
}

// kick wakes the loop.
func (s *lswitch) kick() {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	_, _ = unix.Write(s.evfd, one)
}

// arm sets the timer to fire at at (zero: never).
func (s *lswitch) arm(at time.Time) {
	var its unix.ItimerSpec
	if !at.IsZero() {
		its.Value = unix.NsecToTimespec(max(time.Until(at).Nanoseconds(), 1))
	}
	_ = unix.TimerfdSettime(s.tfd, 0, &its, nil)
}

func (s *lswitch) loop() {
	// The thread is the loop's alone, so that its CPU time is the switch's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(s.done)
	t := &table{where: map[[6]byte]*port{}}
	defer func() { // the TAPs go with their files
		for _, p := range t.ports {
			unix.Close(p.fd)
		}
	}()
	byFD := map[int32]*port{}
	events := make([]unix.EpollEvent, 64)
	buf := make([]byte, maxFrame)
	var scratch [8]byte
	var to []*port
	var armed time.Time
	for {
		s.mu.Lock()
		for _, p := range s.pending {
			t.ports = append(t.ports, p)
			byFD[int32(p.fd)] = p
		}
		s.pending = s.pending[:0]
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		now := time.Now()
		for _, p := range t.ports {
			p.due(now, s.send)
		}
		if next := t.next(); !next.Equal(armed) {
			s.arm(next)
			armed = next
		}
		var ts unix.Timespec
		if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) == nil {
			s.cpu.Store(ts.Nano())
		}
		n, err := unix.EpollWait(s.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.errors.Add(1)
			return
		}
		for _, ev := range events[:n] {
			switch int(ev.Fd) {
			case s.tfd:
				_, _ = unix.Read(s.tfd, scratch[:])
				armed = time.Time{} // one-shot: fired
			case s.evfd:
				_, _ = unix.Read(s.evfd, scratch[:])
			default:
				p := byFD[ev.Fd]
				if p == nil {
					continue // attached, taken at the top of the loop
				}
				// At most 64 frames per wake, so that a flood on one
				// TAP does not hold up the writes that are due.
				for range 64 {
					k, err := unix.Read(p.fd, buf)
					if err != nil {
						if !errors.Is(err, unix.EAGAIN) {
							s.errors.Add(1)
						}
						break
					}
					if k < vnetHdrLen+14 {
						s.dropped.Add(1)
						continue
					}
					now := time.Now()
					eth := buf[vnetHdrLen:k]
					var src, dst [6]byte
					copy(dst[:], eth[0:6])
					copy(src[:], eth[6:12])
					to = t.route(p, src, dst, to[:0])
					for _, q := range to {
						if !t.enqueue(q, buf[:k], now.Add(p.delay+q.delay)) {
							s.dropped.Add(1)
						}
					}
				}
			}
		}
	}
}

// send writes a frame to port q's TAP.
func (s *lswitch) send(q *port, b []byte) {
	if _, err := unix.Write(q.fd, b); err != nil {
		s.errors.Add(1)
		return
	}
	s.frames.Add(1)
	s.bytes.Add(int64(len(b) - vnetHdrLen))
}

func (s *lswitch) counters() LinkCounters {
	return LinkCounters{Frames: s.frames.Load(), Bytes: s.bytes.Load(), Dropped: s.dropped.Load(),
		Errors: s.errors.Load(), CPU: time.Duration(s.cpu.Load())}
}

// close stops the loop and closes the TAPs (the kernel removes them). It
// is safe to call more than once.
func (s *lswitch) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.kick()
	s.mu.Unlock()
	<-s.done
	s.closeFDs()
}

// closeFDs closes the switch's descriptors and its TAPs, once the loop
// has ended (or never started).
func (s *lswitch) closeFDs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pending {
		unix.Close(p.fd)
	}
	s.pending = nil
	for _, fd := range []int{s.epfd, s.tfd, s.evfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	s.epfd, s.tfd, s.evfd = -1, -1, -1
}
