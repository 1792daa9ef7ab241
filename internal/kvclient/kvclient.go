// Package kvclient talks to test/workloads/kvserver, the HTTP key-value
// store that the network clone tests and benchmarks park and clone.
package kvclient

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"time"
)

// Port is the kvserver's HTTP port.
const Port = "8080"

// Client sends requests to one kvserver, each on a new connection.
type Client struct {
	addr string
	http *http.Client
}

// New returns a client of the kvserver at host (an IP address).
func New(host string) *Client {
	return &Client{
		addr: "http://" + net.JoinHostPort(host, Port),
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
}

// do sends one request and returns the body of a 200 response.
func (c *Client) do(method, path string, q url.Values) (string, error) {
	u := c.addr + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", method, u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s %s: status %d: %s", method, u, resp.StatusCode, b)
	}
	return string(b), nil
}

// Get returns the value of k.
func (c *Client) Get(k string) (string, error) {
	return c.do("GET", "/get", url.Values{"k": {k}})
}

// Set sets k to v.
func (c *Client) Set(k, v string) error {
	_, err := c.do("POST", "/set", url.Values{"k": {k}, "v": {v}})
	return err
}

// Whoami returns the server's interface addresses, space-separated.
func (c *Client) Whoami() (string, error) {
	return c.do("GET", "/whoami", nil)
}

// WaitGet retries Get every millisecond until it succeeds or timeout
// passes: the first answer of a server that is being restored.
func (c *Client) WaitGet(k string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := c.Get(k)
		if err == nil || time.Now().After(deadline) {
			return v, err
		}
		time.Sleep(time.Millisecond)
	}
}

// Load sends sequential GETs of k on one kept-alive connection for d and
// returns requests per second and the 50th and 99th percentile latency in
// microseconds. Any failed request is an error.
func (c *Client) Load(k string, d time.Duration) (rps, p50, p99 float64, err error) {
	client := &http.Client{Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	u := c.addr + "/get?" + url.Values{"k": {k}}.Encode()
	var lat []float64
	start := time.Now()
	for time.Since(start) < d {
		t := time.Now()
		resp, err := client.Get(u)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("GET %s: %w", u, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, 0, 0, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
		}
		lat = append(lat, float64(time.Since(t).Microseconds()))
	}
	sort.Float64s(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	return float64(len(lat)) / time.Since(start).Seconds(), pct(0.5), pct(0.99), nil
}
