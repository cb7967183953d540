// Package v1alpha1 is the dev cloud's NodeClass: what a NodePool names as its nodes' class. A dev
// instance has nothing to configure (its image, network and disk are this machine's), so the
// class carries only the Ready condition Karpenter requires of every NodeClass.
package v1alpha1

import (
	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// Group is the API group of DevNodeClass.
const Group = "devcloud.coroner.dev"

// DevNodeClass is cluster-scoped; its status is defaulted Ready by its CRD (nothing can be unready).
type DevNodeClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              DevNodeClassSpec   `json:"spec,omitempty"`
	Status            DevNodeClassStatus `json:"status,omitempty"`
}

// DevNodeClassSpec is empty: see the package comment.
type DevNodeClassSpec struct{}

// DevNodeClassStatus holds the conditions Karpenter reads.
type DevNodeClassStatus struct {
	Conditions []status.Condition `json:"conditions,omitempty"`
}

// DevNodeClassList is a list of DevNodeClass.
type DevNodeClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DevNodeClass `json:"items"`
}

func (in *DevNodeClass) StatusConditions(opts ...status.ForOption) status.ConditionSet {
	return status.NewReadyConditions().For(in, opts...)
}

func (in *DevNodeClass) GetConditions() []status.Condition { return in.Status.Conditions }

func (in *DevNodeClass) SetConditions(conditions []status.Condition) {
	in.Status.Conditions = conditions
}

func (in *DevNodeClass) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Status.Conditions = append([]status.Condition(nil), in.Status.Conditions...)
	return &out
}

func (in *DevNodeClassList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = make([]DevNodeClass, len(in.Items))
	for i := range in.Items {
		out.Items[i] = *in.Items[i].DeepCopyObject().(*DevNodeClass)
	}
	return &out
}

// Karpenter's clients use client-go's scheme, as its kwok provider's types do.
func init() {
	gv := schema.GroupVersion{Group: Group, Version: "v1alpha1"}
	metav1.AddToGroupVersion(scheme.Scheme, gv)
	scheme.Scheme.AddKnownTypes(gv, &DevNodeClass{}, &DevNodeClassList{})
}
