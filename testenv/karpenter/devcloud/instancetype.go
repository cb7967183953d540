package devcloud

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
)

const (
	// InstanceTypeName is the one instance type: every dev instance is this whole machine, shared
	// with the cluster's other nodes (a dev node has no cgroup limit of its own).
	InstanceTypeName = "dev.host"
	// Zone is the one zone; CapacityType the one capacity type (nothing here is ever reclaimed).
	Zone         = "dev-local"
	CapacityType = v1.CapacityTypeOnDemand
	// maxPods is the kubelet's default, which the dev node keeps.
	maxPods = 110
)

// Machine is what a dev node's kubelet reports as its capacity: this machine's processors and
// memory, the size of the filesystem holding the node's directory, the kubelet's pod limit.
type Machine struct {
	CPUs             int64
	MemoryBytes      int64
	EphemeralStorage int64
}

// ReadMachine reads the figures the kubelet reads (cAdvisor counts /proc/cpuinfo's processors and
// takes /proc/meminfo's MemTotal), so the capacity Karpenter plans with is the one the Node shows.
func ReadMachine(nodeDirectory string) (Machine, error) {
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return Machine{}, err
	}
	cpus := int64(0)
	for _, line := range bytes.Split(cpuinfo, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("processor")) {
			cpus++
		}
	}
	if cpus == 0 {
		cpus = int64(runtime.NumCPU())
	}
	memory, err := memTotal()
	if err != nil {
		return Machine{}, err
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(nodeDirectory, &fs); err != nil {
		return Machine{}, fmt.Errorf("statfs %s: %w", nodeDirectory, err)
	}
	return Machine{CPUs: cpus, MemoryBytes: memory, EphemeralStorage: int64(fs.Blocks) * fs.Bsize}, nil
}

func memTotal() (int64, error) {
	file, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer file.Close()
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kib, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("MemTotal %q: %w", fields[1], err)
			}
			return kib * 1024, nil
		}
	}
	return 0, fmt.Errorf("no MemTotal in /proc/meminfo")
}

// InstanceTypes describes this machine as the one type Karpenter may launch. Its overhead is what
// the dev kubelet withholds from allocatable: nothing reserved, and its hard eviction thresholds
// (memory.available 100Mi, nodefs.available 1%).
func InstanceTypes(m Machine) []*cloudprovider.InstanceType {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(m.CPUs, resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(m.MemoryBytes, resource.BinarySI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(m.EphemeralStorage, resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(maxPods, resource.DecimalSI),
	}
	offering := &cloudprovider.Offering{
		Requirements: scheduling.NewRequirements(
			scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, Zone),
			scheduling.NewRequirement(v1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, CapacityType),
		),
		Price:     1,
		Available: true,
	}
	return []*cloudprovider.InstanceType{{
		Name: InstanceTypeName,
		Requirements: scheduling.NewRequirements(
			scheduling.NewRequirement(corev1.LabelInstanceTypeStable, corev1.NodeSelectorOpIn, InstanceTypeName),
			scheduling.NewRequirement(corev1.LabelArchStable, corev1.NodeSelectorOpIn, runtime.GOARCH),
			scheduling.NewRequirement(corev1.LabelOSStable, corev1.NodeSelectorOpIn, string(corev1.Linux)),
			scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, Zone),
			scheduling.NewRequirement(v1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, CapacityType),
		),
		Offerings: cloudprovider.Offerings{offering},
		Capacity:  capacity,
		Overhead: &cloudprovider.InstanceTypeOverhead{
			KubeReserved:   corev1.ResourceList{},
			SystemReserved: corev1.ResourceList{},
			EvictionThreshold: corev1.ResourceList{
				corev1.ResourceMemory:           resource.MustParse("100Mi"),
				corev1.ResourceEphemeralStorage: *resource.NewQuantity(m.EphemeralStorage/100, resource.BinarySI),
			},
		},
	}}
}
