package admission

import (
	"net/netip"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
)

func TestFinishedRateCountsTheLastWholeSecond(t *testing.T) {
	var f finishedRate
	steps := []struct {
		add  []int64 // seconds of requests finished
		at   int64
		want int
	}{
		{nil, 10, 0},
		{[]int64{10, 10, 10}, 10, 3}, // the second going on, already more
		{[]int64{11}, 11, 3},         // the last whole second
		{nil, 12, 1},                 // 11 is the last whole second now
		{nil, 13, 0},                 // nothing finished in 12
		{[]int64{15, 15}, 15, 2},     // after a gap, nothing carried over
		{[]int64{16}, 16, 2},
		{[]int64{14, 15}, 16, 2}, // a request begun before: not counted
	}
	for i, s := range steps {
		for _, sec := range s.add {
			f.add(sec)
		}
		if got := f.perSecond(s.at); got != s.want {
			t.Errorf("step %d: perSecond(%d) = %d, want %d", i+1, s.at, got, s.want)
		}
	}
}

// Under contention an address that finishes requests may hold more than
// its share, for as long as it keeps finishing them; one that holds
// without finishing keeps its share.
func TestAnAddressThatFinishesRequestsClaimsMoreThanItsShare(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var tab clientTable
	tab.init(Limits{MaxConns: 100, ConnsPerClient: 4, RequestsPerClient: 4}, clk.Now)
	nat, attack := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	conns := func(key netip.Addr) int {
		n := 0
		for range 100 {
			if _, ok := tab.addConn(key, true); !ok {
				return n
			}
			n++
		}
		return n
	}
	if got := conns(nat); got != 4 {
		t.Fatalf("a new address opened %d connections under contention, want its share, 4", got)
	}
	for range 10 {
		e, why := tab.addRequest(nat, clk.Now(), true)
		if why != Admitted {
			t.Fatalf("a request within the share: %v", why)
		}
		tab.finishRequest(e, clk.Now().Unix())
	}
	if got := conns(nat); got != claimSeconds*10-4 {
		t.Errorf("after 10 requests finished, %d more connections, want %d (up to %d in all)", got, claimSeconds*10-4, claimSeconds*10)
	}
	var held []*clientEntry
	for range 12 {
		e, why := tab.addRequest(nat, clk.Now(), true)
		if why != Admitted {
			break
		}
		held = append(held, e)
	}
	if len(held) != 10 {
		t.Errorf("%d requests in flight admitted after 10 finished, want 10", len(held))
	}
	for _, e := range held {
		tab.finishRequest(e, clk.Now().Unix())
	}

	if got := conns(attack); got != 4 {
		t.Fatalf("the attacker opened %d connections, want its share, 4", got)
	}
	for range 4 {
		if _, why := tab.addRequest(attack, clk.Now(), true); why != Admitted {
			t.Fatalf("a held request within the share: %v", why)
		}
	}
	if _, why := tab.addRequest(attack, clk.Now(), true); why != RefusedClientRequests {
		t.Errorf("a fifth held request: %v, want %v", why, RefusedClientRequests)
	}

	e := tab.entry(nat)
	if got := tab.overShare(e); got != 0 {
		t.Errorf("the NAT, still finishing requests, is %d past its share, want 0", got)
	}
	clk.Advance(claimSeconds * time.Second)
	if got, want := tab.overShare(e), e.conns()-4; got != want {
		t.Errorf("the NAT, %v after its last request, is %d past its share, want %d", claimSeconds*time.Second, got, want)
	}
}
