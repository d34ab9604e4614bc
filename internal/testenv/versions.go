package testenv

import (
	"context"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Versions records every version of one object that a watch delivers, from the version
// it was given on: what a watcher such as MetalLB saw, not what polling happened to see.
type Versions[T client.Object] struct {
	mu   sync.Mutex
	seen []T
	stop func()
	done chan struct{}
}

// WatchVersions watches obj (as it is now: name, namespace, resource version) with a
// client of cfg; list is an empty list of its kind.
func WatchVersions[T client.Object](ctx context.Context, cfg *rest.Config, list client.ObjectList, obj T) (*Versions[T], error) {
	c, err := client.NewWithWatch(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	w, err := c.Watch(ctx, list, client.InNamespace(obj.GetNamespace()), client.MatchingFields{"metadata.name": obj.GetName()},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: obj.GetResourceVersion()}})
	if err != nil {
		return nil, err
	}
	v := &Versions[T]{stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(v.done)
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok {
				v.mu.Lock()
				v.seen = append(v.seen, o)
				v.mu.Unlock()
			}
		}
	}()
	return v, nil
}

// Seen is the versions delivered so far.
func (v *Versions[T]) Seen() []T {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.seen)
}

// Stop ends the watch and returns every version it delivered.
func (v *Versions[T]) Stop() []T {
	v.stop()
	<-v.done
	return v.Seen()
}
