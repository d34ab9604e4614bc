package registrar

// Len is the number of keys kept and of claims holding some, for tests of pruning.
func (f *InFlight) Len() (keys, claims int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.slots), len(f.byClaim)
}
