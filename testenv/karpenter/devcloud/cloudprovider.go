// Package devcloud is a Karpenter cloud provider whose instances are real nodes of a Coroner dev
// cluster on this machine, modelled on Karpenter's kwok provider. Where kwok creates a Node object
// with no kubelet behind it, Create here asks the dev cluster to boot containerd and a kubelet that
// registers its own Node with the claim's providerID, and Delete kills that node as a cloud
// terminates an instance: everything at once, with no shutdown. The dev cluster (Python) owns the
// nodes' lifecycle; this provider calls its command and reads its instance records.
package devcloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/awslabs/operatorpkg/status"
	"github.com/samber/lo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"coroner.dev/testenv/karpenter/apis/v1alpha1"
)

const (
	// CommandVariable names a JSON array: the argv of `coroner dev-cluster instance --dir DIR`.
	CommandVariable = "CORONER_DEVCLOUD_COMMAND"
	// RecordsVariable names the directory of the instances' records.
	RecordsVariable = "CORONER_DEVCLOUD_RECORDS"
)

type CloudProvider struct {
	kubeClient    client.Client
	control       Control
	instanceTypes []*cloudprovider.InstanceType
}

// New reads the provider's two variables and describes this machine.
func New(ctx context.Context, kubeClient client.Client) (*CloudProvider, error) {
	var command []string
	if err := json.Unmarshal([]byte(os.Getenv(CommandVariable)), &command); err != nil || len(command) == 0 {
		return nil, fmt.Errorf("%s must be a JSON array naming the dev cluster's instance command (got %q)", CommandVariable, os.Getenv(CommandVariable))
	}
	records := os.Getenv(RecordsVariable)
	if records == "" {
		return nil, fmt.Errorf("%s must name the directory of the instance records", RecordsVariable)
	}
	if err := os.MkdirAll(records, 0o755); err != nil {
		return nil, err
	}
	machine, err := ReadMachine(records)
	if err != nil {
		return nil, err
	}
	return &CloudProvider{
		kubeClient:    kubeClient,
		control:       Control{Command: command, Records: records},
		instanceTypes: InstanceTypes(machine),
	}, nil
}

func (c *CloudProvider) Create(ctx context.Context, nodeClaim *v1.NodeClaim) (*v1.NodeClaim, error) {
	nodeClass := &v1alpha1.DevNodeClass{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: nodeClaim.Spec.NodeClassRef.Name}, nodeClass); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("resolving the DevNodeClass, %w", err))
		}
		return nil, fmt.Errorf("resolving the DevNodeClass, %w", err)
	}
	if ready := nodeClass.StatusConditions().Get(status.ConditionReady); ready.IsFalse() {
		return nil, cloudprovider.NewNodeClassNotReadyError(errors.New(ready.Message))
	}
	requirements := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	instanceType, offering, found := c.cheapest(requirements)
	if !found {
		return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("no dev instance type offering fits the NodeClaim's requirements"))
	}
	zone := offering.Requirements.Get(corev1.LabelTopologyZone).Any()
	capacityType := offering.Requirements.Get(v1.CapacityTypeLabelKey).Any()
	// The claim's name is unique among live claims and short: the instance, its Node and its
	// directories are all named by it.
	if err := c.control.Launch(ctx, nodeClaim.Name, instanceType.Name, zone, capacityType); err != nil {
		return nil, fmt.Errorf("launching a dev instance, %w", err)
	}
	return c.toNodeClaim(Instance{
		Name: nodeClaim.Name, ProviderID: ProviderPrefix + nodeClaim.Name,
		InstanceType: instanceType.Name, Zone: zone, CapacityType: capacityType, State: "booting",
	}), nil
}

func (c *CloudProvider) cheapest(requirements scheduling.Requirements) (*cloudprovider.InstanceType, *cloudprovider.Offering, bool) {
	var best *cloudprovider.InstanceType
	var bestOffering *cloudprovider.Offering
	// Karpenter has already chosen the instance types that fit the claim: its instance-type
	// requirement names them. Of those, the cheapest offering compatible with the claim.
	chosen := requirements.Get(corev1.LabelInstanceTypeStable)
	for _, it := range c.instanceTypes {
		if !chosen.Has(it.Name) {
			continue
		}
		offerings := it.Offerings.Available().Compatible(requirements)
		if len(offerings) == 0 {
			continue
		}
		if cheapest := offerings.Cheapest(); bestOffering == nil || cheapest.Price < bestOffering.Price {
			best, bestOffering = it, cheapest
		}
	}
	return best, bestOffering, best != nil
}

func (c *CloudProvider) Delete(ctx context.Context, nodeClaim *v1.NodeClaim) error {
	name, ok := nameOf(nodeClaim.Status.ProviderID)
	if !ok {
		return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("providerID %q is no dev instance", nodeClaim.Status.ProviderID))
	}
	if err := c.control.Terminate(ctx, name); err != nil {
		return fmt.Errorf("terminating dev instance %s, %w", name, err)
	}
	// Terminated synchronously: nothing is left to wait for.
	return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("dev instance %s terminated", name))
}

func (c *CloudProvider) Get(ctx context.Context, providerID string) (*v1.NodeClaim, error) {
	name, ok := nameOf(providerID)
	if !ok {
		return nil, cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("providerID %q is no dev instance", providerID))
	}
	instance, err := c.control.Get(name)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && instance.Gone()) {
		return nil, cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("dev instance %s does not exist", name))
	}
	if err != nil {
		return nil, err
	}
	return c.toNodeClaim(instance), nil
}

func (c *CloudProvider) List(ctx context.Context) ([]*v1.NodeClaim, error) {
	instances, err := c.control.List()
	if err != nil {
		return nil, fmt.Errorf("listing dev instances, %w", err)
	}
	var claims []*v1.NodeClaim
	for _, instance := range instances {
		if !instance.Gone() {
			claims = append(claims, c.toNodeClaim(instance))
		}
	}
	return claims, nil
}

func (c *CloudProvider) toNodeClaim(instance Instance) *v1.NodeClaim {
	labels := map[string]string{
		corev1.LabelInstanceTypeStable: instance.InstanceType,
		corev1.LabelTopologyZone:       instance.Zone,
		v1.CapacityTypeLabelKey:        instance.CapacityType,
	}
	claim := &v1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: instance.Name, Labels: labels},
		Status:     v1.NodeClaimStatus{NodeName: instance.Name, ProviderID: instance.ProviderID},
	}
	if it, found := lo.Find(c.instanceTypes, func(it *cloudprovider.InstanceType) bool { return it.Name == instance.InstanceType }); found {
		for _, r := range it.Requirements {
			if r.Len() == 1 && r.Operator() == corev1.NodeSelectorOpIn {
				labels[r.Key] = r.Values()[0]
			}
		}
		claim.Status.Capacity = it.Capacity
		claim.Status.Allocatable = it.Allocatable()
	}
	return claim
}

func (c *CloudProvider) GetInstanceTypes(ctx context.Context, nodePool *v1.NodePool) ([]*cloudprovider.InstanceType, error) {
	return c.instanceTypes, nil
}

// IsDrifted: a dev instance has no image or configuration that could drift from its NodeClass.
func (c *CloudProvider) IsDrifted(ctx context.Context, nodeClaim *v1.NodeClaim) (cloudprovider.DriftReason, error) {
	return "", nil
}

func (c *CloudProvider) Reboot(ctx context.Context, nodeClaim *v1.NodeClaim, operationID string) error {
	return cloudprovider.NewNodeRebootNotImplementedError()
}

// RepairPolicies: a Node whose kubelet stopped reporting is replaced, as on a cloud.
func (c *CloudProvider) RepairPolicies() []cloudprovider.RepairPolicy {
	replace := func(s corev1.ConditionStatus) cloudprovider.RepairPolicy {
		return cloudprovider.RepairPolicy{
			ConditionType: corev1.NodeReady, ConditionStatus: s, ReasonRegex: ".*",
			TolerationDuration: 10 * time.Minute, TerminationGracePeriod: lo.ToPtr(time.Duration(0)),
			Action: cloudprovider.ReplaceNode,
		}
	}
	return []cloudprovider.RepairPolicy{replace(corev1.ConditionFalse), replace(corev1.ConditionUnknown)}
}

func (c *CloudProvider) Name() string { return "coroner-dev" }

func (c *CloudProvider) GetSupportedNodeClasses() []status.Object {
	return []status.Object{&v1alpha1.DevNodeClass{}}
}
