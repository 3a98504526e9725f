package netns

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// openTap makes TAP device name in the calling thread's network namespace
// (call it inside Host.Do): frames with a virtio-net header, and the
// kernel's checksum and TCP segmentation offloads when it allows them, so
// that a TCP burst of up to 64 KiB is one frame. The device goes away when
// the file is closed.
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
	// Non-blocking, so that reads wait in Go's poller and Close ends them.
	return &tapDevice{f: os.NewFile(uintptr(fd), name), name: name}, nil
}

// sleepShort sleeps d in the kernel, blocking the calling thread, whose
// timer slack it first lowers from the default 50 µs to 1 µs (a lan
// link's delay is 50 µs).
func sleepShort(d time.Duration) {
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
