package netns

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// tapDevice is one host's TAP, opened in its namespace: a non-blocking
// descriptor the switch reads and writes.
type tapDevice struct {
	fd   int
	name string
}

// openTap makes TAP device name in the calling thread's network namespace
// (call it inside Host.Do): frames with a virtio-net header, and the
// kernel's checksum and TCP segmentation offloads when it allows them, so
// that a TCP burst of up to 64 KiB is one frame. The device goes away when
// the descriptor is closed.
func openTap(name string) (*tapDevice, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("/dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TAP %s: %w", name, err)
	}
	// Without the offloads the kernel segments before the TAP: frames of
	// the MTU, more work for the switch, the same traffic.
	_ = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6)
	return &tapDevice{fd: fd, name: name}, nil
}
