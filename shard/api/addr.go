package api

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// MaxAddrLen is the longest address a node may register (client, peer or
// gossip): a DNS name of 253 bytes, a colon and a port, with room to spare.
// Addresses go into every metadata log entry and snapshot, and into the
// Raft configurations of every group the node holds.
const MaxAddrLen = 261

// CheckAddr returns an error wrapping ErrBadRequest unless addr is a
// host:port a node may advertise (what: which address, for the message): at
// most MaxAddrLen bytes, a host of letters, digits, '.', '-', '_', ':' or '%'
// (IPv6 in brackets, with a zone) that is not empty, and a port 1 to 65535.
func CheckAddr(what, addr string) error {
	shown := addr
	if len(shown) > 64 {
		shown = shown[:64] + "..."
	}
	if len(addr) > MaxAddrLen {
		return fmt.Errorf("%w: %s %q is %d bytes, longer than %d", ErrBadRequest, what, shown, len(addr), MaxAddrLen)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %s %q: %v", ErrBadRequest, what, shown, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("%w: %s %q: port %q is not 1 to 65535", ErrBadRequest, what, shown, port)
	}
	if host == "" || strings.IndexFunc(host, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-_:%", r))
	}) >= 0 {
		return fmt.Errorf("%w: %s %q: the host must be a name or IP address of letters, digits, '.', '-', '_', ':' or '%%'", ErrBadRequest, what, shown)
	}
	return nil
}
