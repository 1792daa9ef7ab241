// Command pause is the pod sandbox ("pause") container of the CRI tests: it
// does nothing until SIGTERM or SIGINT, then exits 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}
