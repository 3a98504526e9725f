//go:build !linux

package netns

import (
	"context"
	"errors"
	"net"
)

var errLinux = errors.New("netns: network namespaces need Linux")

// Do needs Linux.
func (h *Host) Do(f func() error) error { return errLinux }

// DialContext needs Linux.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return nil, errLinux
}

// Listen needs Linux.
func (h *Host) Listen(network, addr string) (net.Listener, error) { return nil, errLinux }
