package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	answer := flag.String("answer", "", "accept TCP connections on this address and write the host name to each")
	flag.Parse()
	if *answer != "" {
		if err := serve(*answer); err != nil {
			fmt.Fprintln(os.Stderr, "pause:", err)
			os.Exit(1)
		}
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			// Reap every child that has ended; -1: any child, WNOHANG: do not block.
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// serve writes the host name to every connection on address, in the background.
func serve(address string) error {
	name, err := os.Hostname()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				fmt.Fprintln(os.Stderr, "pause: no more connections:", err)
				return
			}
			_, _ = fmt.Fprintln(conn, name)
			_ = conn.Close()
		}
	}()
	return nil
}
