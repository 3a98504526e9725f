//go:build !linux

package netns

import (
	"errors"
	"time"
)

var errNoTap = errors.New("netns: TAP devices need Linux")

type tapDevice struct{}

func openTap(name string) (*tapDevice, error) { return nil, errNoTap }

type lswitch struct{}

func newSwitch() (*lswitch, error)                              { return nil, errNoTap }
func (s *lswitch) attach(tap *tapDevice, d time.Duration) error { return errNoTap }
func (s *lswitch) counters() LinkCounters                       { return LinkCounters{} }
func (s *lswitch) close()                                       {}
