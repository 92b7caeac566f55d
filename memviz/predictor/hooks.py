"""Global module and optimizer hooks: which module runs, which phase the program is in, what is what.

A module's forward names the module (its path from the outermost module whose forward runs) and tags its
parameters and buffers; an optimizer step tags the gradients and, after it, the optimizer's state; the phase
follows (setup → forward → backward → optimizer → other).
"""

from __future__ import annotations

from typing import Any

import torch

from .session import Session

__all__ = ["install_hooks"]


def install_hooks(session: Session) -> list[Any]:
    """Global module and optimizer hooks naming the module and the phase; their handles to remove."""
    names = session.module_names

    def pre(module: torch.nn.Module, args: Any) -> None:
        key = id(module)
        name = names.get(key)
        if name is None:
            name = type(module).__name__
            if session.module_stack:
                parent = session.modules.get(session.module_stack_ids[-1])
                if parent is not None:
                    for child_name, child in parent._modules.items():
                        if child is module:
                            name = f"{session.module_stack[-1]}.{child_name}"
                            break
            names[key] = name
            session.modules[key] = module
            for p in module.parameters(recurse=False):
                session.tag(p, "parameters")
            for b in module.buffers(recurse=False):
                session.tag(b, "parameters")
        if session.phase not in ("backward", "forward"):
            session.set_phase("forward")
        session.module_stack.append(name)
        session.module_stack_ids.append(key)

    def post(module: torch.nn.Module, args: Any, output: Any) -> None:
        if session.module_stack:
            session.module_stack.pop()
            session.module_stack_ids.pop()

    def step_pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        session.set_phase("optimizer")
        for group in opt.param_groups:
            for p in group["params"]:
                session.tag(p, "parameters")
                session.tag(p.grad, "gradients")

    def step_post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for state in opt.state.values():
            for v in state.values():
                session.tag(v, "optimizer state")
        session.set_phase("other")

    import torch.optim.optimizer as optimizer
    from torch.nn.modules import module as module_mod

    return [module_mod.register_module_forward_pre_hook(pre),
            module_mod.register_module_forward_hook(post, always_call=True),
            optimizer.register_optimizer_step_pre_hook(step_pre),
            optimizer.register_optimizer_step_post_hook(step_post)]


