// etcd for healthd's real-control-plane tests: upstream's own server main, built from
// the pinned module (go install refuses it because of its monorepo replace lines).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
