package peerrate

import (
	"net"
	"testing"
)

// TestKey names peers: an IPv4 address whole (carried in IPv6 too), an
// IPv6 address by its prefix of the length given, the whole address for a
// length of 128 or one out of range, and an address without an IP as it is.
func TestKey(t *testing.T) {
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 4321} }
	for _, tc := range []struct {
		addr net.Addr
		bits int
		want string
	}{
		{tcp("10.1.2.3"), 64, "10.1.2.3"},
		{tcp("::ffff:10.1.2.3"), 64, "10.1.2.3"},
		{tcp("2001:db8:1:2:3:4:5:6"), 64, "2001:db8:1:2::/64"},
		{tcp("2001:db8:1:2:ffff::1"), 64, "2001:db8:1:2::/64"},
		{tcp("2001:db8:1:2:3:4:5:6"), 56, "2001:db8:1::/56"},
		{tcp("2001:db8:1:2:3:4:5:6"), 128, "2001:db8:1:2:3:4:5:6"},
		{tcp("2001:db8:1:2:3:4:5:6"), 0, "2001:db8:1:2:3:4:5:6"},
		{&net.UDPAddr{IP: net.ParseIP("2001:db8::9")}, 64, "2001:db8::/64"},
		{&net.IPAddr{IP: net.ParseIP("2001:db8::9")}, 64, "2001:db8::9"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, 64, "/run/x.sock"},
		{nil, 64, ""},
	} {
		if got := Key(tc.addr, tc.bits); got != tc.want {
			t.Errorf("Key(%v, %d) = %q, want %q", tc.addr, tc.bits, got, tc.want)
		}
	}
	if got := Of(tcp("2001:db8:1:2:3:4:5:6")); got != "2001:db8:1:2::/64" {
		t.Errorf("Of keys by %q, want the /64", got)
	}
}
