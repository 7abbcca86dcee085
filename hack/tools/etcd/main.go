// Command etcd runs etcd's own entry point; it exists so that the test API
// server's storage can be built from a pinned module version.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
