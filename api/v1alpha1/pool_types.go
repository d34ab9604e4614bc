package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IPFamily is the address family of a pool.
// +kubebuilder:validation:Enum=IPv4;IPv6
type IPFamily string

const (
	// IPv4 is the IPv4 address family (the IPAM-API's "ipv4").
	IPv4 IPFamily = "IPv4"
	// IPv6 is the IPv6 address family (the IPAM-API's "ipv6").
	IPv6 IPFamily = "IPv6"
)

// VitistackIPPoolSpec is the desired state of a Vitistack pool: one (zone, family) slice
// of the vitistack IPAM-API, plus what the provider writes into every IPAddress.
// +kubebuilder:validation:XValidation:rule="!has(self.gateway) || !isIP(self.gateway) || (self.ipFamily == 'IPv4' ? ip(self.gateway).family() == 4 : ip(self.gateway).family() == 6)",message="gateway must be an address of the pool's ipFamily"
// +kubebuilder:validation:XValidation:rule="!has(self.prefix) || self.ipFamily == 'IPv6' || self.prefix <= 32",message="prefix must be between 1 and 32 for ipFamily IPv4"
// +kubebuilder:validation:XValidation:rule="!has(self.caBundleRef) || (has(self.endpoint) && self.endpoint.startsWith('https://'))",message="caBundleRef needs an https:// endpoint"
// +kubebuilder:validation:XValidation:rule="!has(self.subnet) || !isCIDR(self.subnet) || cidr(self.subnet).ip().family() == (self.ipFamily == 'IPv4' ? 4 : 6)",message="subnet must be a CIDR of the pool's ipFamily"
// +kubebuilder:validation:XValidation:rule="!has(self.subnet) || !isCIDR(self.subnet) || !has(self.gateway) || !isIP(self.gateway) || cidr(self.subnet).containsIP(self.gateway)",message="gateway must lie inside subnet"
// +kubebuilder:validation:XValidation:rule="!has(self.excludedAddresses) || has(self.subnet)",message="excludedAddresses needs subnet (they are skipped when the provider picks addresses of the subnet)"
// +kubebuilder:validation:XValidation:rule="!has(self.excludedAddresses) || !has(self.subnet) || !isCIDR(self.subnet) || self.excludedAddresses.all(e, e.contains('-') ? (e.split('-').size() == 2 && isIP(e.split('-')[0]) && isIP(e.split('-')[1]) && cidr(self.subnet).containsIP(e.split('-')[0]) && cidr(self.subnet).containsIP(e.split('-')[1])) : (isIP(e) ? cidr(self.subnet).containsIP(e) : (isCIDR(e) && cidr(self.subnet).containsCIDR(e))))",message="every excludedAddresses entry must be an address, a CIDR or a range first-last inside subnet"
// +kubebuilder:validation:XValidation:rule="!has(self.subnet) || !isCIDR(self.subnet) || !has(self.prefix) || self.prefix <= cidr(self.subnet).prefixLength()",message="prefix must not be longer than the subnet's prefix length"
type VitistackIPPoolSpec struct {
	// zone is the IPAM-API zone addresses are allocated from, for example inet,
	// hnet-private or hnet-public.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Zone string `json:"zone"`

	// ipFamily is the address family of the pool: IPv4 or IPv6. A dual-stack consumer
	// uses one pool per family.
	// +required
	IPFamily IPFamily `json:"ipFamily"`

	// prefix is the prefix length written into every IPAddress of this pool. Defaults to
	// 32 for IPv4 and 128 for IPv6 (the IPAM-API hands out host addresses); set it, with
	// gateway, for addresses that live in a node network.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	Prefix *int32 `json:"prefix,omitempty"`

	// gateway is the default gateway written into every IPAddress of this pool. It must
	// be an address of the pool's ipFamily.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="gateway must be a valid IP address, for example 10.20.0.1"
	Gateway string `json:"gateway,omitempty"`

	// secretRef names the Secret whose value owns the addresses of this pool in the
	// IPAM-API. Unset means the provider's default secret.
	// +optional
	SecretRef *SecretReference `json:"secretRef,omitempty"`

	// retentionPeriodDays is how long the IPAM-API keeps a released address for its
	// owner before it frees it (0 to 30 days). Claims may override it by annotation.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=30
	RetentionPeriodDays *int32 `json:"retentionPeriodDays,omitempty"`

	// denyExternalCleanup asks the IPAM-API not to let external systems clean up the
	// addresses of this pool. Claims may override it by annotation.
	// +optional
	DenyExternalCleanup bool `json:"denyExternalCleanup,omitempty"`

	// endpoint is the IPAM-API base URL (for example https://ipam-api.vitistack.io), without
	// the /v2 path. Unset means the manager's --ipam-api-url flag.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="endpoint must be an http:// or https:// URL, for example https://ipam-api.vitistack.io"
	Endpoint string `json:"endpoint,omitempty"`

	// caBundleRef names a ConfigMap or Secret holding the PEM CA bundle that signs the
	// endpoint's TLS certificate. Unset means the system's trust store.
	// +optional
	CABundleRef *CABundleReference `json:"caBundleRef,omitempty"`

	// subnet switches the pool to subnet mode: the provider picks host addresses of this
	// node network itself, in order (never the network address, the IPv4 broadcast
	// address, the gateway or an excluded address), and registers each explicitly. The
	// IPAddress gets the subnet's prefix length (or prefix) and the gateway. Without it
	// the pool is in routed mode: the IPAM-API picks any free address of the zone. The
	// subnet must lie inside the zone.
	// +optional
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="subnet must be a network in CIDR form, for example 10.20.0.0/24"
	Subnet string `json:"subnet,omitempty"`

	// excludedAddresses are addresses (10.20.0.5), CIDRs (10.20.0.16/28) or ranges
	// (10.20.0.100-10.20.0.120) of the subnet that are never handed out.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=91
	ExcludedAddresses []string `json:"excludedAddresses,omitempty"`

	// clusterID is the cluster_id sent to the IPAM-API for claims of this pool. Unset
	// means the manager's --cluster-id flag, else the UID of the kube-system Namespace.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ClusterID string `json:"clusterID,omitempty"`

	// allowIdentityOverrides lets claims of this pool choose the IPAM-API identity
	// they register under with the ipam.vitistack.io/service-name, namespace-id and
	// cluster-id annotations. Off by default: with a shared secret, an override could
	// re-register another tenant's identity and take over its address. Claims the
	// Service controller makes may always carry their Service's name.
	// +optional
	AllowIdentityOverrides bool `json:"allowIdentityOverrides,omitempty"`
}

// SecretReference names a key of a Secret.
type SecretReference struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// namespace of the Secret. For a VitistackIPPool it must be empty (the pool's own
	// namespace is used); for a GlobalVitistackIPPool it is required.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// key in the Secret's data that holds the value. Defaults to "secret".
	// +optional
	// +kubebuilder:default=secret
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// CABundleReference names a key of a ConfigMap or Secret that holds PEM certificates.
type CABundleReference struct {
	// kind of the object: ConfigMap (default) or Secret.
	// +optional
	// +kubebuilder:default=ConfigMap
	// +kubebuilder:validation:Enum=ConfigMap;Secret
	Kind string `json:"kind,omitempty"`

	// name of the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// namespace of the object. For a VitistackIPPool it must be empty (the pool's own
	// namespace is used); for a GlobalVitistackIPPool it is required.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// key that holds the PEM bundle. Defaults to "ca.crt".
	// +optional
	// +kubebuilder:default=ca.crt
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// VitistackIPPoolStatus is the observed state of a pool.
// +kubebuilder:validation:MinProperties=1
type VitistackIPPoolStatus struct {
	// conditions describe the pool's state. Ready says whether claims can be served:
	// the secret resolves and the IPAM-API accepts the pool's zone and family.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// addressesInUse is the number of IPAddresses allocated from this pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AddressesInUse *int32 `json:"addressesInUse,omitempty"`

	// subnetSize is the number of addresses of the subnet the provider may hand out
	// (subnet mode; without network, broadcast, gateway and excluded addresses). It is
	// capped at 2^63-1 for large IPv6 subnets.
	// +optional
	SubnetSize *int64 `json:"subnetSize,omitempty"`

	// observedGeneration is the pool generation the status was computed for.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="clusterctl.cluster.x-k8s.io/move-hierarchy="
// +kubebuilder:resource:path=vitistackippools,scope=Namespaced,categories=cluster-api,shortName=vip
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Zone",type="string",JSONPath=".spec.zone",description="IPAM-API zone"
// +kubebuilder:printcolumn:name="Family",type="string",JSONPath=".spec.ipFamily",description="Address family"
// +kubebuilder:printcolumn:name="Subnet",type="string",JSONPath=".spec.subnet",description="Node network (subnet mode)"
// +kubebuilder:printcolumn:name="In use",type="integer",JSONPath=".status.addressesInUse",description="Addresses allocated from this pool"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",description="Whether the pool can serve claims"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason",description="Why the pool is (not) ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp",description="Time since creation"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name must be at most 63 characters: it is written into the ipam.vitistack.io/pool-name label of every IPAddress"

// VitistackIPPool is a namespaced pool of addresses from the vitistack IPAM-API. It
// serves IPAddressClaims in its own namespace.
type VitistackIPPool struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object's metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the pool.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.secretRef) || !has(self.secretRef.__namespace__)",message="secretRef.namespace must be empty for a VitistackIPPool: the Secret is read from the pool's own namespace"
	// +kubebuilder:validation:XValidation:rule="!has(self.caBundleRef) || !has(self.caBundleRef.__namespace__)",message="caBundleRef.namespace must be empty for a VitistackIPPool: the object is read from the pool's own namespace"
	Spec VitistackIPPoolSpec `json:"spec"`

	// status is the observed state of the pool.
	// +optional
	Status VitistackIPPoolStatus `json:"status,omitempty,omitzero"`
}

// +kubebuilder:object:root=true

// VitistackIPPoolList is a list of VitistackIPPools.
type VitistackIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the pools.
	Items []VitistackIPPool `json:"items"`
}

// +kubebuilder:object:root=true
// +kubebuilder:metadata:labels="clusterctl.cluster.x-k8s.io/move-hierarchy="
// +kubebuilder:resource:path=globalvitistackippools,scope=Cluster,categories=cluster-api,shortName=gvip
// +kubebuilder:subresource:status
// +kubebuilder:storageversion
// +kubebuilder:printcolumn:name="Zone",type="string",JSONPath=".spec.zone",description="IPAM-API zone"
// +kubebuilder:printcolumn:name="Family",type="string",JSONPath=".spec.ipFamily",description="Address family"
// +kubebuilder:printcolumn:name="Subnet",type="string",JSONPath=".spec.subnet",description="Node network (subnet mode)"
// +kubebuilder:printcolumn:name="In use",type="integer",JSONPath=".status.addressesInUse",description="Addresses allocated from this pool"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status",description="Whether the pool can serve claims"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason",description="Why the pool is (not) ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp",description="Time since creation"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="metadata.name must be at most 63 characters: it is written into the ipam.vitistack.io/pool-name label of every IPAddress"

// GlobalVitistackIPPool is a cluster-scoped pool of addresses from the vitistack
// IPAM-API. It serves IPAddressClaims from every namespace (for example Services).
type GlobalVitistackIPPool struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object's metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the pool.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.secretRef) || has(self.secretRef.__namespace__)",message="secretRef.namespace is required for a GlobalVitistackIPPool"
	// +kubebuilder:validation:XValidation:rule="!has(self.caBundleRef) || has(self.caBundleRef.__namespace__)",message="caBundleRef.namespace is required for a GlobalVitistackIPPool"
	Spec VitistackIPPoolSpec `json:"spec"`

	// status is the observed state of the pool.
	// +optional
	Status VitistackIPPoolStatus `json:"status,omitempty,omitzero"`
}

// +kubebuilder:object:root=true

// GlobalVitistackIPPoolList is a list of GlobalVitistackIPPools.
type GlobalVitistackIPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the pools.
	Items []GlobalVitistackIPPool `json:"items"`
}

// Pool is what both pool kinds have in common; controllers work on it.
// +kubebuilder:object:generate=false
type Pool interface {
	client.Object
	PoolSpec() *VitistackIPPoolSpec
	PoolStatus() *VitistackIPPoolStatus
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
}

// WorkedBefore reports whether the IPAM-API accepted the pool's zone and family when
// it was last checked, or failed only for its own backend since: a "no prefixes found"
// answer is then the IPAM-API restarting, not the pool's fault.
func WorkedBefore(p Pool) bool {
	for _, c := range p.GetConditions() {
		if c.Type == PoolReadyCondition {
			return c.Status == metav1.ConditionTrue || c.Reason == PoolReadyBackendFailingReason
		}
	}
	return false
}

// PoolSpec returns the pool's spec.
func (p *VitistackIPPool) PoolSpec() *VitistackIPPoolSpec { return &p.Spec }

// PoolStatus returns the pool's status.
func (p *VitistackIPPool) PoolStatus() *VitistackIPPoolStatus { return &p.Status }

// GetConditions returns the pool's conditions.
func (p *VitistackIPPool) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions sets the pool's conditions.
func (p *VitistackIPPool) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

// PoolSpec returns the pool's spec.
func (p *GlobalVitistackIPPool) PoolSpec() *VitistackIPPoolSpec { return &p.Spec }

// PoolStatus returns the pool's status.
func (p *GlobalVitistackIPPool) PoolStatus() *VitistackIPPoolStatus { return &p.Status }

// GetConditions returns the pool's conditions.
func (p *GlobalVitistackIPPool) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions sets the pool's conditions.
func (p *GlobalVitistackIPPool) SetConditions(c []metav1.Condition) { p.Status.Conditions = c }

func init() {
	objectTypes = append(objectTypes, &VitistackIPPool{}, &VitistackIPPoolList{}, &GlobalVitistackIPPool{}, &GlobalVitistackIPPoolList{})
}
