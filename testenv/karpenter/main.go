// Command karpenter is Karpenter's core (sigs.k8s.io/karpenter) with the dev cloud provider, whose
// instances are real nodes of a Coroner dev cluster on this machine: containerd and a kubelet each.
// It is wired as Karpenter's own kwok binary is, with that provider in place of kwok's.
package main

import (
	"sigs.k8s.io/controller-runtime/pkg/log"

	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"

	"coroner.dev/testenv/karpenter/devcloud"
)

func main() {
	ctx, op := operator.NewOperator()
	cloud, err := devcloud.New(ctx, op.GetClient())
	if err != nil {
		log.FromContext(ctx).Error(err, "the dev cloud provider cannot start")
		panic(err)
	}
	decorated := overlay.Decorate(cloud, op.GetClient(), op.InstanceTypeStore)
	cluster := state.NewCluster(op.Clock, op.GetClient(), decorated)
	op.WithControllers(ctx, controllers.NewControllers(
		ctx,
		op.Manager,
		op.Clock,
		op.GetClient(),
		op.EventRecorder,
		decorated,
		cloud,
		cluster,
		op.InstanceTypeStore,
		op.PredictionStore,
	)...).Start(ctx)
}
