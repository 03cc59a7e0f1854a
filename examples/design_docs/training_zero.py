"""Training guide, ZeRO optimizer step, as written on 2 dp ranks: the step
takes no batch, so `ts.distribute(strategy="zero_redundancy_optimizer")`
makes it per-rank code; each parameter's owner (`hash(param_name) % size`:
`tessera launch` gives every rank the same PYTHONHASHSEED) applies Adam and
every other rank receives the result with `ts.distributed.recv_from`, whose
send the compiler adds to the owner's program (it traces every rank's).
`adam_update_single_param`, the parameters, gradients and Adam moments are
filled in. Checked against a float64 numpy Adam step: every rank ends with
every updated parameter, bit-identical across ranks.

    tessera launch -n 2 examples/design_docs/training_zero.py
"""
from typing import Dict

import numpy as np

import tessera as ts
from tessera import dist


def adam_update_single_param(weight, gradient, state, lr=1e-2, b1=0.9, b2=0.999, eps=1e-8):
    m = b1 * state["m"] + (1 - b1) * gradient
    v = b2 * state["v"] + (1 - b2) * gradient * gradient
    step = state["step"] + 1.0
    m_hat = m / (1 - ts.exp(step * float(np.log(b1))))      # bias corrections b ** step
    v_hat = v / (1 - ts.exp(step * float(np.log(b2))))
    return weight - lr * m_hat / (ts.sqrt(v_hat) + eps)


@ts.function
@ts.distribute(strategy="zero_redundancy_optimizer")
def zero_optimizer_step(
    weights: Dict[str, ts.Tensor],
    gradients: Dict[str, ts.Tensor],
    optimizer_state: Dict[str, ts.Tensor]
) -> Dict[str, ts.Tensor]:
    """ZeRO optimizer for memory-efficient data parallelism."""
    
    # ZeRO-2: Partition optimizer states across GPUs
    # Each GPU only stores optimizer state for subset of parameters
    
    updated_weights = {}
    
    for param_name, gradient in gradients.items():
        # Determine which GPU owns this parameter's optimizer state
        owner_rank = hash(param_name) % ts.mesh.current().size
        
        if ts.mesh.current().rank == owner_rank:
            # This GPU owns the optimizer state for this parameter
            param_optimizer_state = optimizer_state[param_name]
            
            # Apply optimizer update
            updated_param = adam_update_single_param(
                weights[param_name], gradient, param_optimizer_state
            )
        else:
            # Other GPUs receive the updated parameter
            updated_param = ts.distributed.recv_from(owner_rank, param_name)
        
        updated_weights[param_name] = updated_param
    
    return updated_weights


mesh = ts.mesh.auto(axes=("dp",))
rng = np.random.default_rng(7)
shapes = {"embed": (6, 4), "w_qkv": (4, 12), "w_out": (4, 4), "ln_scale": (4,)}
weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
gradients = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
state = {k: {"m": 0.1 * rng.standard_normal(s).astype(np.float32),
             "v": np.abs(rng.standard_normal(s)).astype(np.float32),
             "step": np.float32(3.0)} for k, s in shapes.items()}

updated = zero_optimizer_step(weights, gradients, state)

owners = {k: hash(k) % mesh.size for k in shapes}
for k in shapes:
    w, g, st = (x.astype(np.float64) for x in (weights[k], gradients[k], state[k]["m"]))
    v = 0.999 * state[k]["v"].astype(np.float64) + 0.001 * g * g
    m = 0.9 * st + 0.1 * g
    ref = w - 1e-2 * (m / (1 - 0.9 ** 4)) / (np.sqrt(v / (1 - 0.999 ** 4)) + 1e-8)
    got = np.asarray(updated[k].numpy() if hasattr(updated[k], "numpy") else updated[k])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
every = dist.all_gather(np.concatenate([np.asarray(updated[k]).ravel() for k in shapes]),
                        axis="dp", dim=0).reshape(mesh.size, -1)
assert (every == every[0]).all(), "ranks hold different parameters"
if mesh.rank == 0:
    print("owners:", owners)
    print("OK training_zero")
