package sim_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// TestParallelRegisterAndRelease hammers the handler from many goroutines (run with
// -race) and checks the invariants a NetBox+MongoDB backend guarantees: an address is
// never handed to two different secrets, and case A never hands out an address twice.
// Nothing is swept during the storm, so no address may legitimately change owner.
func TestParallelRegisterAndRelease(t *testing.T) {
	g := NewWithT(t)
	s := sim.New(sim.Config{RandSeed: 7})
	g.Expect(s.SetLatency(0, 500*time.Microsecond)).To(Succeed()) // interleave lookup and commit

	secrets := []string{"secret-one-1", "secret-two-2", "secret-three-3"}
	type grant struct{ address, secret, message string }
	var (
		mu     sync.Mutex
		grants []grant
	)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 1))
			var mine []grant
			for range 60 {
				secret := secrets[rnd.IntN(len(secrets))]
				svc := fmt.Sprintf("svc-%d", rnd.IntN(20))
				addr := ""
				switch op := rnd.IntN(4); {
				case op == 0 && len(mine) > 0: // release something this worker got
					gr := mine[rnd.IntN(len(mine))]
					serve(s, http.MethodDelete, "/v2/service", body(gr.secret, "inet", "ipv4", gr.address, svc, 0))
					continue
				case op == 1 && len(mine) > 0: // share an address (case D), maybe with the wrong secret
					addr = mine[rnd.IntN(len(mine))].address
				case op == 2:
					addr = fmt.Sprintf("83.118.169.%d/32", rnd.IntN(16)) // contested case C
				}
				a := serve(s, http.MethodPost, "/v2/address", body(secret, "inet", "ipv4", addr, svc, 0))
				if a.status != http.StatusOK {
					continue
				}
				var out struct{ Message, Address string }
				if err := json.Unmarshal([]byte(a.body), &out); err != nil {
					t.Errorf("bad body %q: %v", a.body, err)
					return
				}
				gr := grant{address: out.Address, secret: secret, message: out.Message}
				mine = append(mine, gr)
				mu.Lock()
				grants = append(grants, gr)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	g.Expect(len(grants)).To(BeNumerically(">", 100))
	owner := map[string]string{}
	allocated := map[string]int{}
	for _, gr := range grants {
		if prev, ok := owner[gr.address]; ok && prev != gr.secret {
			t.Fatalf("address %s granted to two secrets", gr.address)
		}
		owner[gr.address] = gr.secret
		if gr.message == "Address registered successfully" {
			allocated[gr.address]++
		}
	}
	for addr, n := range allocated {
		g.Expect(n).To(Equal(1), "address %s allocated %d times", addr, n)
	}
	seen := map[string]bool{}
	for _, r := range s.Registrations() {
		g.Expect(seen[r.Address]).To(BeFalse(), "address %s stored twice", r.Address)
		seen[r.Address] = true
		g.Expect(r.SecretFingerprint).To(Equal(sim.Fingerprint(owner[r.Address])))
		g.Expect(r.Holders).NotTo(BeEmpty())
	}
	g.Expect(seen).To(HaveLen(len(owner)), "every granted address is still registered (nothing was swept)")

	// Everything released with retention 0 is freed by one sweep.
	s.Sweep()
	for _, r := range s.Registrations() {
		for _, h := range r.Holders {
			g.Expect(h.ExpiresAt).To(BeNil())
		}
	}
}
