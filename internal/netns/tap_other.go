//go:build !linux

package netns

import (
	"errors"
	"time"
)

func openTap(name string) (*tapDevice, error) {
	return nil, errors.New("netns: TAP devices need Linux")
}

func sleepShort(d time.Duration) { time.Sleep(d) }
