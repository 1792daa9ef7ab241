// Command kvserver is a stateful network workload for clones with a network:
// an HTTP key-value store held in memory, and a TCP port that holds the
// connections made to it open, so that a test can see what a workload's
// established connections become when its sandbox is parked and cloned.
//
// Usage: kvserver [-http :8080] [-hold :9000] [-mib N]
//
// HTTP:
//
//	GET /get?k=K        the value of K (404 if unset)
//	POST /set?k=K&v=V   sets K to V
//	GET /whoami         the addresses of the sandbox's interfaces
//
// The server fills an N MiB heap at start (so that parking it writes real
// memory) and prints, one per line:
//
//	ready http=ADDR hold=ADDR
//	held n=N from=PEER            a connection to the hold port was accepted
//	held n=N ended: ERR           reading that connection failed (ERR "EOF" for a clean close)
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
)

func main() {
	httpAddr := flag.String("http", ":8080", "HTTP listen address")
	holdAddr := flag.String("hold", ":9000", "TCP address whose connections are held open")
	mib := flag.Int("mib", 16, "heap to fill at start, in MiB")
	flag.Parse()

	if *mib < 1 {
		fmt.Fprintf(os.Stderr, "kvserver: -mib %d: want at least 1\n", *mib)
		os.Exit(2)
	}
	heap := make([]byte, *mib<<20)
	for i := range heap {
		heap[i] = byte(i * 7)
	}

	var (
		mu    sync.Mutex
		store = map[string]string{}
	)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v, ok := store[r.URL.Query().Get("k")]
		mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, v)
	})
	mux.HandleFunc("POST /set", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		mu.Lock()
		store[q.Get("k")] = q.Get("v")
		mu.Unlock()
		fmt.Fprint(w, "ok")
	})
	mux.HandleFunc("GET /whoami", func(w http.ResponseWriter, r *http.Request) {
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var s []string
		for _, a := range addrs {
			s = append(s, a.String())
		}
		sort.Strings(s)
		fmt.Fprint(w, strings.Join(s, " "))
	})

	hl, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %v\n", err)
		os.Exit(1)
	}
	tl, err := net.Listen("tcp", *holdAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvserver: %v\n", err)
		os.Exit(1)
	}
	go hold(tl)
	fmt.Printf("ready http=%s hold=%s heap=%d\n", hl.Addr(), tl.Addr(), heap[len(heap)-1])
	err = http.Serve(hl, mux)
	// The heap stays part of the server's memory for as long as it serves.
	runtime.KeepAlive(heap)
	fmt.Fprintf(os.Stderr, "kvserver: %v\n", err)
	os.Exit(1)
}

// hold accepts connections on l and reads each until it fails, printing
// what happened.
func hold(l net.Listener) {
	for n := 0; ; n++ {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvserver: accept: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("held n=%d from=%s\n", n, c.RemoteAddr())
		go func(n int, c net.Conn) {
			buf := make([]byte, 4096)
			for {
				if _, err := c.Read(buf); err != nil {
					fmt.Printf("held n=%d ended: %v\n", n, err)
					c.Close()
					return
				}
			}
		}(n, c)
	}
}
