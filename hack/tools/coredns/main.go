// Command coredns is CoreDNS with the plugins the local node's Corefile
// names (bind, errors, health, ready, kubernetes, cache, loadbalance) and no
// others: the upstream binary links every plugin, most of them cloud DNS
// providers whose SDKs would dominate a cold build.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
