package memnet

import (
	"container/heap"
	"runtime"
	"sync"
	"time"
	"weak"
)

// alarms wakes the network's blocked readers and writers at their
// deadlines and at the arrival times of what is in flight, with one timer
// for the whole network. A timer per blocked read would do, but thousands
// of streams each holding one (a node serves a stream per peer that asks
// it, each waiting for its next request under a deadline) make the Go
// runtime's timer heap that large, and on a virtual clock the runtime
// scans all of it whenever a timer is reset: at every step of the clock.
//
// An alarm signals a channel (a half's readable or writable); the waiter
// then looks at its half again and, if it still has to wait, sets another
// alarm. A waiter woken by data leaves its alarm set; it goes off later
// for nothing, and is not set again while it is pending: each of a half's
// two channels has at most one alarm pending, or two for a moment when one
// is moved earlier.
//
// An alarm refers to its half weakly. An answerer waits for each next
// request under a deadline seconds ahead, and most streams finish long
// before it: a pending alarm that held its half kept about three finished
// streams alive for every open one in a 1000-node testnet. A waiter holds
// its half while it waits, so only alarms no one waits on lose theirs.
type alarms struct {
	mu    sync.Mutex
	queue alarmQueue
	timer *time.Timer // made on first use, so on the clock of its user
	next  time.Time   // when timer goes off; zero if it is not set
}

type alarm struct {
	at    time.Time
	h     weak.Pointer[half]
	write bool // for h's writer (writable), not its reader (readable)
}

// wait blocks until h's readable (or, if write, writable) channel is
// signalled or, if not zero, until the earlier of until and deadline; it
// reports whether the deadline has passed.
func (a *alarms) wait(h *half, write bool, until, deadline time.Time) (expired bool) {
	_, c := h.alarm(write) // the channel is fixed; only the slot needs alarms.mu
	t := until
	if !deadline.IsZero() && (t.IsZero() || deadline.Before(t)) {
		t = deadline
	}
	if !t.IsZero() {
		if !time.Now().Before(t) {
			return !deadline.IsZero() && !time.Now().Before(deadline)
		}
		a.set(h, write, t)
	}
	<-c
	runtime.KeepAlive(h) // its alarm holds it only weakly
	return !deadline.IsZero() && !time.Now().Before(deadline)
}

// set makes sure h's channel is signalled at t or before.
func (a *alarms) set(h *half, write bool, t time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	slot, _ := h.alarm(write)
	if !slot.IsZero() && !slot.After(t) {
		return // one at t or before is pending
	}
	*slot = t
	if h.self == (weak.Pointer[half]{}) {
		h.self = weak.Make(h)
	}
	heap.Push(&a.queue, alarm{at: t, h: h.self, write: write})
	if a.next.IsZero() || t.Before(a.next) {
		a.next = t
		d := time.Until(t)
		if a.timer == nil {
			a.timer = time.AfterFunc(d, a.ring)
		} else {
			a.timer.Reset(d)
		}
	}
}

// ring signals every alarm that is due and sets the timer for the next.
func (a *alarms) ring() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for len(a.queue) > 0 && !a.queue[0].at.After(now) {
		e := heap.Pop(&a.queue).(alarm)
		h := e.h.Value()
		if h == nil {
			continue // no one waits on a half that is gone
		}
		if slot, c := h.alarm(e.write); slot.Equal(e.at) { // else it was moved earlier and has gone off
			*slot = time.Time{}
			wake(c)
		}
	}
	a.next = time.Time{}
	if len(a.queue) > 0 {
		a.next = a.queue[0].at
		a.timer.Reset(a.next.Sub(now))
	}
}

// alarmQueue is a min-heap of alarms by time (container/heap).
type alarmQueue []alarm

func (q alarmQueue) Len() int           { return len(q) }
func (q alarmQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q alarmQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *alarmQueue) Push(x any)        { *q = append(*q, x.(alarm)) }
func (q *alarmQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = alarm{}
	*q = old[:len(old)-1]
	return e
}
