package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/testenv"
)

var (
	env *testenv.Env
	ctx = context.Background()
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark asked for: do not start a control plane
	}
	var err error
	opts := testenv.DefaultOptions()
	opts.IPAMAPITimeout = 5 * time.Second
	env, err = testenv.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

func setup(b *testing.B) string {
	b.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	pool := &ipamv1alpha1.VitistackIPPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "pool"},
		Spec: ipamv1alpha1.VitistackIPPoolSpec{Zone: "hnet-private", IPFamily: ipamv1alpha1.IPv4}}
	if err := env.Client.Create(ctx, pool); err != nil {
		b.Fatal(err)
	}
	return ns.Name
}

func claim(ns, name string) *ipamv1.IPAddressClaim {
	return &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: ipamv1.IPPoolReference{APIGroup: "ipam.vitistack.io", Kind: "VitistackIPPool", Name: "pool"}}}
}

func waitBound(b *testing.B, ns string, n int) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		list := &ipamv1.IPAddressList{}
		if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		if len(list.Items) >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("%d claims not bound in time", n)
}

// BenchmarkClaimToAddress: one claim at a time, from create to a visible IPAddress.
func BenchmarkClaimToAddress(b *testing.B) {
	ns := setup(b)
	b.ResetTimer()
	for i := range b.N {
		if err := env.Client.Create(ctx, claim(ns, fmt.Sprintf("c-%d", i))); err != nil {
			b.Fatal(err)
		}
		waitBound(b, ns, i+1)
	}
}

// BenchmarkBurst200: 200 claims created at once until all are bound.
func BenchmarkBurst200(b *testing.B) {
	for range b.N {
		ns := setup(b)
		start := time.Now()
		for i := range 200 {
			if err := env.Client.Create(ctx, claim(ns, fmt.Sprintf("c-%d", i))); err != nil {
				b.Fatal(err)
			}
		}
		waitBound(b, ns, 200)
		b.ReportMetric(float64(time.Since(start).Milliseconds())/200, "ms/claim")
	}
}
