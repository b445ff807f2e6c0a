package console

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// limiter bounds sign-in attempts: per client address (an IPv6 client by
// its /64, which one host usually has whole) and over all clients, as
// token buckets. It holds at most maxAddrs addresses; when that many are
// still cooling down, attempts from new addresses are refused, so that a
// flood of addresses can slow every sign-in down but cannot grow the
// table or let more guesses through. Keys are 256-bit random, so the
// limit is not what stops a guess; it keeps a flood of sign-ins (each a
// database lookup) off the store. It is safe for concurrent use.
type limiter struct {
	perAddr, global rate
	maxAddrs        int

	mu    sync.Mutex
	addrs map[netip.Prefix]*bucket
	all   bucket
}

// rate is a bucket's size and how long one token takes to come back.
type rate struct {
	burst float64
	every time.Duration
}

type bucket struct {
	tokens float64
	last   time.Time
}

// take takes a token from b, refilled at r since its last use, and says
// when the next one comes if there is none.
func (b *bucket) take(r rate, now time.Time) (bool, time.Duration) {
	b.refill(r, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) * float64(r.every))
}

func (b *bucket) refill(r rate, now time.Time) {
	if b.last.IsZero() {
		b.tokens = r.burst
	} else if d := now.Sub(b.last); d > 0 {
		b.tokens = min(r.burst, b.tokens+float64(d)/float64(r.every))
	}
	b.last = now
}

func newLimiter(perAddr, global rate, maxAddrs int) *limiter {
	return &limiter{perAddr: perAddr, global: global, maxAddrs: maxAddrs, addrs: map[netip.Prefix]*bucket{}}
}

// clientPrefix is the address a request's attempts count against. A
// daemon behind a proxy sees the proxy's address: all its clients then
// share one bucket.
func clientPrefix(remoteAddr string) netip.Prefix {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Prefix{}
	}
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// allow takes one attempt for the client at addr, and says how long to
// wait when it is refused.
func (l *limiter) allow(addr netip.Prefix, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.addrs[addr]
	if b == nil {
		if len(l.addrs) >= l.maxAddrs {
			l.forgetRested(now)
		}
		if len(l.addrs) >= l.maxAddrs {
			return false, l.perAddr.every
		}
		b = &bucket{}
		l.addrs[addr] = b
	}
	// The address's own bucket first: a client over its limit does not
	// use up everyone's.
	if ok, wait := b.take(l.perAddr, now); !ok {
		return false, wait
	}
	if ok, wait := l.all.take(l.global, now); !ok {
		b.tokens++ // not this client's fault
		return false, wait
	}
	return true, 0
}

// forgetRested drops the addresses whose buckets are full again: they
// are as good as new. Called with mu held.
func (l *limiter) forgetRested(now time.Time) {
	for a, b := range l.addrs {
		if b.refill(l.perAddr, now); b.tokens >= l.perAddr.burst {
			delete(l.addrs, a)
		}
	}
}
