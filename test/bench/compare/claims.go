package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pkg/errors"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/localcluster"
)

// tracker watches the IPAddressClaims of claimNamespace (an informer) and remembers
// when it first saw each one with status.addressRef, and which still exist.
type tracker struct {
	mu      sync.Mutex
	bound   map[string]time.Time
	present map[string]bool
	// goneAt is when the last claim disappeared.
	goneAt time.Time
	// wake gets a value after every change, for waitFor.
	wake chan struct{}
}

func startTracker(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme) (*tracker, error) {
	t := &tracker{bound: map[string]time.Time{}, present: map[string]bool{}, wake: make(chan struct{}, 1)}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{claimNamespace: {}}})
	if err != nil {
		return nil, errors.Wrap(err, "creating the claim watch")
	}
	inf, err := c.GetInformer(ctx, &ipamv1.IPAddressClaim{})
	if err != nil {
		return nil, errors.Wrap(err, "creating the claim informer")
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    t.seen,
		UpdateFunc: func(_, obj any) { t.seen(obj) },
		DeleteFunc: t.gone,
	}); err != nil {
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("the claim watch did not sync")
	}
	return t, nil
}

func (t *tracker) seen(obj any) {
	now := time.Now()
	c, ok := obj.(*ipamv1.IPAddressClaim)
	if !ok {
		return
	}
	t.mu.Lock()
	t.present[c.Name] = true
	if _, done := t.bound[c.Name]; !done && c.Status.AddressRef.Name != "" {
		t.bound[c.Name] = now
	}
	t.mu.Unlock()
	t.poke()
}

func (t *tracker) gone(obj any) {
	now := time.Now()
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	c, ok := obj.(*ipamv1.IPAddressClaim)
	if !ok {
		return
	}
	t.mu.Lock()
	delete(t.present, c.Name)
	if len(t.present) == 0 {
		t.goneAt = now
	}
	t.mu.Unlock()
	t.poke()
}

func (t *tracker) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// counts returns how many claims were seen bound and how many exist.
func (t *tracker) counts() (bound, present int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.bound), len(t.present)
}

func (t *tracker) boundAt(name string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.bound[name]
	return at, ok
}

// waitFor waits until done is true, looking after every change and every 100 ms. It
// fails when proc exits or after timeout, saying what it waited for.
func (t *tracker) waitFor(ctx context.Context, proc *localcluster.Process, timeout time.Duration, what func() string, done func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return errors.Errorf("timed out after %s: %s", timeout, what())
		case <-t.wake:
		case <-tick.C:
			if exited, err := proc.Exited(); exited {
				return errors.Errorf("%s exited (%v): %s", proc.Name, err, what())
			}
		}
	}
	return nil
}

func claimName(i int) string { return fmt.Sprintf("claim-%05d", i) }

// parallel runs do(i) for i in [0, n) on workers goroutines and returns the first error.
func parallel(n, workers int, do func(i int) error) error {
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var first error
			for i := range next {
				if err := do(i); err != nil && first == nil {
					first = err
				}
			}
			errs <- first
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// creator creates claims and remembers when each create returned.
type creator struct {
	cl      client.Client
	poolRef ipamv1.IPPoolReference
	mu      sync.Mutex
	created map[string]time.Time
}

func (c *creator) create(ctx context.Context, i int) error {
	claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: claimNamespace, Name: claimName(i)},
		Spec: ipamv1.IPAddressClaimSpec{PoolRef: c.poolRef}}
	if err := c.cl.Create(ctx, claim); err != nil {
		return errors.Wrapf(err, "creating %s", claim.Name)
	}
	now := time.Now()
	c.mu.Lock()
	c.created[claim.Name] = now
	c.mu.Unlock()
	return nil
}

func deleteClaim(ctx context.Context, cl client.Client, i int) error {
	claim := &ipamv1.IPAddressClaim{ObjectMeta: metav1.ObjectMeta{Namespace: claimNamespace, Name: claimName(i)}}
	if err := cl.Delete(ctx, claim); err != nil && !apierrors.IsNotFound(err) {
		return errors.Wrapf(err, "deleting %s", claim.Name)
	}
	return nil
}
