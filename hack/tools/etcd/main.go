// Command etcd is a pinned build of etcd's server: etcd's own module has replace
// directives, so `go install` refuses it and hotload builds it through this wrapper.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
