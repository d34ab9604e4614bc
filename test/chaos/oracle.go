package chaos

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	ipamv1alpha1 "github.com/vitistack/cluster-api-ipam-provider-vitistack/api/v1alpha1"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/controllers/secret"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/index"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/record"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/internal/registrar"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi"
	"github.com/vitistack/cluster-api-ipam-provider-vitistack/pkg/ipamapi/sim"
)

// Accounts is what the accounting oracle finds at a quiet moment: every entry names the
// object or the registration that breaks the promise. Its classes are the promise: no
// address leaked or handed out twice, no record of an address the IPAM-API does not
// hold, nothing deleted left behind, and every Secret protected exactly while pools or
// records need it.
type Accounts struct {
	// Leaked: held live by the IPAM-API for an identity in scope (under any cluster ID),
	// and accounted for by no claim: neither by the IPAddress of a claim bound to it, nor
	// by an unbound claim's record (a record without an address, written before a
	// request, accounts for one address of its identity: the answer may have been lost).
	Leaked []string
	// Duplicated: one address bound by two IPAddresses that do not both declare the
	// same share key.
	Duplicated []string
	// Orphaned: an IPAddress without a record, with a record the IPAM-API does not hold
	// live, or whose claim is gone or bound to another IPAddress.
	Orphaned []string
	// Mismatched: an IPAddress whose spec.address is not the address its record names.
	Mismatched []string
	// Stuck: deleted objects (claims, IPAddresses, Services, Secrets, namespaces) that
	// are still there.
	Stuck []string
	// Protections: a Secret whose protection disagrees with the pools and records:
	// the secret-in-use finalizer or a value fingerprint that none needs, or a key that
	// one names without them; or a protected Secret the provider's list of
	// protected Secrets does not name.
	Protections []string
}

// Zero reports whether the oracle found nothing wrong.
func (a Accounts) Zero() bool {
	return len(a.Leaked)+len(a.Duplicated)+len(a.Orphaned)+len(a.Mismatched)+len(a.Stuck)+len(a.Protections) == 0
}

// Entries lists every finding, each headed with its class.
func (a Accounts) Entries() []string {
	var out []string
	for _, c := range []struct {
		class string
		list  []string
	}{{"leaked", a.Leaked}, {"duplicated", a.Duplicated}, {"orphaned", a.Orphaned}, {"mismatched", a.Mismatched},
		{"stuck", a.Stuck}, {"protections", a.Protections}} {
		for _, e := range c.list {
			out = append(out, c.class+": "+e)
		}
	}
	return out
}

func (a Accounts) String() string {
	return fmt.Sprintf("leaked %q, duplicated %q, orphaned %q, mismatched %q, stuck %q, protections %q",
		a.Leaked, a.Duplicated, a.Orphaned, a.Mismatched, a.Stuck, a.Protections)
}

// holding is one holder of one address in the IPAM-API.
type holding struct{ address, service, ns, cluster string }

// holder is the holder's identity as service/namespace ID/cluster ID.
func (h holding) holder() string { return h.service + "/" + h.ns + "/" + h.cluster }

func holdingOf(r *record.Registration) holding {
	return holding{r.Address, r.Identity.ServiceName, r.Identity.NamespaceID, r.Identity.ClusterID}
}

// Account compares what the IPAM-API holds (held: the stand-in's registrations) with
// what the cluster records (c: read with List only), for the identities and objects of
// the namespaces whose UIDs are in scope (a namespace may be gone by then: its holders
// are still in scope); a nil scope is every namespace and every holder the IPAM-API has
// (a test that owns the whole IPAM-API). defaultSecret is the provider's default Secret,
// which pools without spec.secretRef name (empty: it is in no namespace of the scope).
func Account(ctx context.Context, c client.Reader, held []sim.Registration, scope map[string]bool, defaultSecret types.NamespacedName) (Accounts, error) {
	var out Accounts
	scoped := func(namespaceID string) bool { return scope == nil || scope[namespaceID] }
	// Every live holder: an IPAddress in scope may record an identity whose namespace
	// ID is overridden to one out of scope. Leaks are looked for in scope only.
	live := map[holding]bool{}
	for _, r := range held {
		for _, h := range r.Holders {
			if h.ExpiresAt == nil {
				live[holding{r.Address, h.ServiceName, h.NamespaceID, h.ClusterID}] = true
			}
		}
	}
	nss := &corev1.NamespaceList{}
	claims := &ipamv1.IPAddressClaimList{}
	addrs := &ipamv1.IPAddressList{}
	for _, list := range []client.ObjectList{nss, claims, addrs} {
		if err := c.List(ctx, list); err != nil {
			return out, err
		}
	}
	ours := map[string]bool{} // the scope's namespaces that still exist, by name
	for _, ns := range nss.Items {
		if scoped(string(ns.UID)) {
			ours[ns.Name] = true
			if !ns.DeletionTimestamp.IsZero() {
				out.Stuck = append(out.Stuck, "Namespace "+ns.Name)
			}
		}
	}
	inScope := func(o client.Object, r *record.Registration) bool {
		return ours[o.GetNamespace()] || (r != nil && scoped(r.Identity.NamespaceID))
	}
	// The Secret keys every pool and every record names, wherever it is.
	named := map[types.NamespacedName]map[string]bool{}
	nameRefs := func(refs ...record.ObjectRef) {
		for _, ref := range refs {
			if named[ref.ObjectKey()] == nil {
				named[ref.ObjectKey()] = map[string]bool{}
			}
			named[ref.ObjectKey()][ref.Key] = true
		}
	}
	name := func(r *record.Registration) { nameRefs(r.Secrets()...) }
	pools, err := index.ListPools(ctx, c)
	if err != nil {
		return out, err
	}
	for _, p := range pools {
		if ref := registrar.PoolSecret(p, defaultSecret); ref.Name != "" {
			nameRefs(ref)
		}
	}

	addrRecords := map[types.NamespacedName]*record.Registration{}
	claimOf := map[types.NamespacedName]types.NamespacedName{} // IPAddress → the claim it names
	byHost := map[string][]ipamv1.IPAddress{}
	for i := range addrs.Items {
		a := &addrs.Items[i]
		key := client.ObjectKeyFromObject(a)
		rec, err := record.OnAddress(a.Labels, a.Annotations)
		if rec != nil {
			name(rec)
		}
		if !inScope(a, rec) {
			continue
		}
		if !a.DeletionTimestamp.IsZero() {
			out.Stuck = append(out.Stuck, fmt.Sprintf("IPAddress %s (finalizers %v)", key, a.Finalizers))
		}
		if err != nil || rec == nil {
			out.Orphaned = append(out.Orphaned, fmt.Sprintf("IPAddress %s has no record (%v)", key, err))
			continue
		}
		addrRecords[key] = rec
		claimOf[key] = types.NamespacedName{Namespace: a.Namespace, Name: a.Spec.ClaimRef.Name}
		if !live[holdingOf(rec)] {
			out.Orphaned = append(out.Orphaned, fmt.Sprintf("IPAddress %s records %s, which the IPAM-API does not hold for %s", key, rec.Address, holdingOf(rec).holder()))
		}
		if !sameAddress(a.Spec.Address, rec.Address) {
			out.Mismatched = append(out.Mismatched, fmt.Sprintf("IPAddress %s has address %q, its record %s", key, a.Spec.Address, rec.Address))
		}
		byHost[rec.HostKey()] = append(byHost[rec.HostKey()], *a)
	}
	for host, list := range byHost {
		share := list[0].Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation]
		for _, a := range list[1:] {
			if share == "" || a.Annotations[ipamv1alpha1.AllowLocalSharedIPAnnotation] != share {
				out.Duplicated = append(out.Duplicated, fmt.Sprintf("%s bound by %d IPAddresses", host, len(list)))
				break
			}
		}
	}

	accounted := map[holding]bool{}
	// A pool's subnet check holds its address while its record is on the pool.
	for _, p := range pools {
		var probe struct {
			Address  string           `json:"address"`
			Identity ipamapi.Identity `json:"identity"`
		}
		if v, ok := p.GetAnnotations()[ipamv1alpha1.SubnetProbeAnnotation]; ok && json.Unmarshal([]byte(v), &probe) == nil {
			if a, err := ipamapi.CanonicalCIDR(probe.Address); err == nil {
				accounted[holding{a, probe.Identity.ServiceName, probe.Identity.NamespaceID, probe.Identity.ClusterID}] = true
			}
		}
	}
	pending := map[holding]int{} // by identity (no address): records that may hold one
	boundTo := map[types.NamespacedName]string{}
	for i := range claims.Items {
		cl := &claims.Items[i]
		key := client.ObjectKeyFromObject(cl)
		rec, _ := record.OnClaim(cl.Annotations)
		if rec != nil {
			name(rec)
		}
		if !inScope(cl, rec) {
			continue
		}
		if !cl.DeletionTimestamp.IsZero() {
			out.Stuck = append(out.Stuck, fmt.Sprintf("IPAddressClaim %s (finalizers %v)", key, cl.Finalizers))
		}
		if ref := cl.Status.AddressRef.Name; ref != "" {
			boundTo[key] = ref
			if a := addrRecords[types.NamespacedName{Namespace: cl.Namespace, Name: ref}]; a != nil {
				accounted[holdingOf(a)] = true
				continue
			}
		}
		switch {
		case rec == nil:
		case rec.Address != "":
			accounted[holdingOf(rec)] = true
		default:
			pending[holdingOf(rec)]++
		}
	}
	for key, claimKey := range claimOf {
		if ref, ok := boundTo[claimKey]; !ok || ref != key.Name {
			out.Orphaned = append(out.Orphaned, fmt.Sprintf("IPAddress %s: its claim %s is gone or not bound to it", key, claimKey))
		}
	}
	for h := range live {
		if accounted[h] || !scoped(h.ns) {
			continue
		}
		id := holding{"", h.service, h.ns, h.cluster}
		if pending[id] > 0 {
			pending[id]--
			continue
		}
		out.Leaked = append(out.Leaked, fmt.Sprintf("%s held by %s", h.address, h.holder()))
	}

	// The Secrets the provider's ledgers list (a protected Secret must be listed, or no
	// new leader looks at it again).
	cms := &corev1.ConfigMapList{}
	if err := c.List(ctx, cms); err != nil {
		return out, err
	}
	listed := map[types.NamespacedName]bool{}
	for i := range cms.Items {
		if cms.Items[i].Name == secret.LedgerName {
			for _, s := range secret.Listed(&cms.Items[i]) {
				listed[s] = true
			}
		}
	}
	for ns := range ours {
		for _, list := range []client.ObjectList{&corev1.ServiceList{}, &corev1.SecretList{}} {
			if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
				return out, err
			}
			switch l := list.(type) {
			case *corev1.ServiceList:
				for i := range l.Items {
					if s := &l.Items[i]; !s.DeletionTimestamp.IsZero() {
						out.Stuck = append(out.Stuck, fmt.Sprintf("Service %s (finalizers %v)", client.ObjectKeyFromObject(s), s.Finalizers))
					}
				}
			case *corev1.SecretList:
				for i := range l.Items {
					s := &l.Items[i]
					if !s.DeletionTimestamp.IsZero() {
						out.Stuck = append(out.Stuck, fmt.Sprintf("Secret %s (finalizers %v)", client.ObjectKeyFromObject(s), s.Finalizers))
					}
					out.Protections = append(out.Protections, protection(s, named[client.ObjectKeyFromObject(s)], listed)...)
				}
			}
		}
	}
	for _, l := range [][]string{out.Leaked, out.Duplicated, out.Orphaned, out.Mismatched, out.Stuck, out.Protections} {
		sort.Strings(l)
	}
	return out, nil
}

// protection lists where a Secret's protection disagrees with the keys pools and records
// name.
func protection(s *corev1.Secret, keys map[string]bool, listed map[types.NamespacedName]bool) []string {
	var out []string
	key := client.ObjectKeyFromObject(s)
	finalizer := controllerutil.ContainsFinalizer(s, ipamv1alpha1.SecretInUseFinalizer)
	if finalizer && !listed[key] {
		out = append(out, fmt.Sprintf("Secret %s has the %s finalizer, and the provider's list of protected Secrets (ConfigMap %s) "+
			"does not name it: a new leader would not look at it again", key, ipamv1alpha1.SecretInUseFinalizer, secret.LedgerName))
	}
	switch {
	case len(keys) > 0 && !finalizer:
		out = append(out, fmt.Sprintf("Secret %s: pools or records name its keys %v, but it has no %s finalizer", key, sortedKeys(keys), ipamv1alpha1.SecretInUseFinalizer))
	case len(keys) == 0 && finalizer:
		out = append(out, fmt.Sprintf("Secret %s keeps the %s finalizer, and no pool or record names it", key, ipamv1alpha1.SecretInUseFinalizer))
	}
	fps := record.Fingerprints(s.Annotations)
	for _, k := range sortedKeys(fps) {
		if !keys[k] {
			out = append(out, fmt.Sprintf("Secret %s keeps the fingerprint of key %q, and no pool or record names it", key, k))
		}
	}
	for _, k := range sortedKeys(keys) {
		if _, ok := fps[k]; !ok {
			if v, has := s.Data[k]; has && registrar.UsableValue(v) {
				out = append(out, fmt.Sprintf("Secret %s: pools or records name its key %q, which has no fingerprint", key, k))
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// sameAddress reports whether an IPAddress's spec.address is the host of a record's
// address (a CIDR, ip/32 or ip/128).
func sameAddress(spec, recorded string) bool {
	a, err := netip.ParseAddr(spec)
	if err != nil {
		return false
	}
	p, err := netip.ParsePrefix(recorded)
	if err != nil {
		return false
	}
	return a == p.Addr()
}

// Strays lists the live holders (held: the stand-in's registrations) under one of
// clusterIDs whose namespace ID is known nowhere in the cluster: the UID of no
// Namespace, of no pool (a subnet check's), and named by no record of a claim or an
// IPAddress (an identity override). That is an identity written wrong or empty, which
// Account, scoped to a scenario's namespaces, does not see.
func Strays(ctx context.Context, c client.Reader, held []sim.Registration, clusterIDs ...string) ([]string, error) {
	nss := &corev1.NamespaceList{}
	claims := &ipamv1.IPAddressClaimList{}
	addrs := &ipamv1.IPAddressList{}
	for _, list := range []client.ObjectList{nss, claims, addrs} {
		if err := c.List(ctx, list); err != nil {
			return nil, err
		}
	}
	pools, err := index.ListPools(ctx, c)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, ns := range nss.Items {
		known[string(ns.UID)] = true
	}
	for _, p := range pools {
		known[string(p.GetUID())] = true
	}
	for i := range claims.Items {
		if rec, _ := record.OnClaim(claims.Items[i].Annotations); rec != nil {
			known[rec.Identity.NamespaceID] = true
		}
	}
	for i := range addrs.Items {
		if rec, _ := record.OnAddress(addrs.Items[i].Labels, addrs.Items[i].Annotations); rec != nil {
			known[rec.Identity.NamespaceID] = true
		}
	}
	delete(known, "")
	var out []string
	for _, r := range held {
		for _, h := range r.Holders {
			if h.ExpiresAt == nil && slices.Contains(clusterIDs, h.ClusterID) && !known[h.NamespaceID] {
				hd := holding{r.Address, h.ServiceName, h.NamespaceID, h.ClusterID}
				out = append(out, fmt.Sprintf("%s held by %s, under a namespace ID known nowhere in the cluster", r.Address, hd.holder()))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// Needles are the strings that show a secret value: the forms in which a log line, an
// event, an object or a metric can carry it, and the fingerprint the provider keeps on
// the Secret (and nowhere else). They are built here, not from the redactor's list
// (ipamapi.ValueForms): a form the redactor misses must not be invisible to the scan
// as well. A needle shorter than 8 characters is left out (it would be found by chance).
func Needles(values ...string) []string {
	var out []string
	add := func(forms ...string) {
		for _, f := range forms {
			if len(f) >= 8 {
				out = append(out, f)
			}
		}
	}
	for _, v := range values {
		if v == "" {
			continue
		}
		b := []byte(v)
		add(v)
		// base64, both alphabets, at each of the three offsets the value can have in a
		// longer blob (a Secret's data of several values, a basic-auth header): the
		// characters that depend on the value's bytes alone.
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			for offset := range 3 {
				add(base64Inside(enc, b, offset))
			}
		}
		add(hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)))
		// Percent-encoding: as a query and a path escape it, and every byte escaped.
		add(url.QueryEscape(v), url.PathEscape(v), percentEvery(b, "%%%02x"), percentEvery(b, "%%%02X"))
		// JSON (with and without HTML escaping, ASCII only, escaped twice) and Go's quoting.
		html, plain := quoted(json.Marshal(v)), jsonWithoutHTMLEscaping(v)
		add(html, plain, asciiEscaped(html), asciiEscaped(plain), quoted(json.Marshal(html)), quoted(json.Marshal(plain)),
			jsonWithoutHTMLEscaping(html), jsonWithoutHTMLEscaping(plain))
		add(unquote(strconv.Quote(v)), unquote(strconv.QuoteToASCII(v)), fmt.Sprintf("% x", b))
		add(fmt.Sprint(b)) //nolint:staticcheck // the list of decimal bytes is the form wanted
		add(strings.TrimPrefix(record.Fingerprint(b), "sha256:"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// base64Inside is the part of b's encoding, b offset bytes into a longer blob, that
// does not depend on the bytes around it.
func base64Inside(enc *base64.Encoding, b []byte, offset int) string {
	x := append(make([]byte, offset), b...)
	s := enc.EncodeToString(x)
	from := (offset + 2) / 3 * 4    // the first group of 3 bytes wholly of b
	to := (offset + len(b)) / 3 * 4 // after the last one
	if from >= to {
		return ""
	}
	return s[from:to]
}

func percentEvery(b []byte, format string) string {
	var sb strings.Builder
	for _, c := range b {
		fmt.Fprintf(&sb, format, c)
	}
	return sb.String()
}

// quoted is a JSON string's text without its quotes (or "" on an error, which a string
// never has).
func quoted(j []byte, err error) string {
	if err != nil || len(j) < 2 {
		return ""
	}
	return string(j[1 : len(j)-1])
}

func unquote(q string) string { return q[1 : len(q)-1] }

func jsonWithoutHTMLEscaping(v string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return quoted(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil)
}

// asciiEscaped writes every non-ASCII character of s as JSON's \u escape (a surrogate
// pair beyond the BMP), as Python's encoder does by default.
func asciiEscaped(s string) string {
	var sb strings.Builder
	for _, r := range s {
		if r < 0x80 {
			sb.WriteRune(r)
			continue
		}
		for _, u := range utf16.Encode([]rune{r}) {
			fmt.Fprintf(&sb, `\u%04x`, u)
		}
	}
	return sb.String()
}

// Find returns, for each needle of values found in a haystack (by name), the name and
// the text around it.
func Find(haystacks map[string]string, values ...string) []string {
	needles := Needles(values...)
	var found []string
	for _, name := range sortedKeys(haystacks) {
		h := haystacks[name]
		for _, n := range needles {
			if i := strings.Index(h, n); i >= 0 {
				found = append(found, fmt.Sprintf("%s: …%s…", name, h[max(0, i-60):min(len(h), i+len(n)+20)]))
			}
		}
	}
	return found
}
