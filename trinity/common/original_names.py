"""Names the original Trinity-RFT registered that this project does not run, and what each needs.

A config from any release of the original is read as written (docs/design-notes.md,
"Earlier releases' configs"): a workflow or reward name of the original's that has no
counterpart here is refused before start with what it needs, instead of "no module named".
``Registry.get`` consults ``not_here`` after its own names, so a plugin that registers one of
these names is used, and before dotted imports and the generic unknown-name error. The
names the original registered that do run here are listed with these in
docs/reference/original-names.md.
"""

from __future__ import annotations

from typing import Dict, Optional

_AGENTSCOPE = "needs the agentscope package (an agent framework driving the rollout model)"
_ALFWORLD = "needs the alfworld environment package (with textworld) and its game files"
_EXAMPLE = (
    "is a plugin module of the original repository's examples/, not part of this project; "
    "port it as a --plugin-dir module"
)

# registry name -> {the original's name -> what it is and what it needs}
NOT_HERE: Dict[str, Dict[str, str]] = {
    "workflows": {
        "alfworld_workflow": f"the original's ALFWorld workflow {_ALFWORLD}",
        "step_wise_alfworld_workflow": f"the original's step-wise ALFWorld workflow {_ALFWORLD}",
        "RAFT_alfworld_workflow": f"the original's RAFT ALFWorld workflow {_ALFWORLD}",
        "RAFT_reflect_alfworld_workflow": (
            f"the original's RAFT ALFWorld workflow with reflection {_ALFWORLD}"
        ),
        "sciworld_workflow": (
            "the original's ScienceWorld workflow needs the scienceworld environment package "
            "(and the Java runtime it starts)"
        ),
        "webshop_workflow": (
            "the original's WebShop workflow needs the WebShop environment (web_agent_site, "
            "installed from its repository, with its product data and search index)"
        ),
        "sudoku_workflow": (
            "the original's multi-step Sudoku workflow (its own puzzle generator and move "
            "judge) is not built here"
        ),
        "email_search_workflow": (
            "the original's email-search workflow (ART's Enron task) "
            f"{_AGENTSCOPE} and the Enron email database"
        ),
        "agentscope_workflow_adapter": f"the original's AgentScope adapter {_AGENTSCOPE}",
        "agentscope_workflow_adapter_v1": f"the original's AgentScope adapter {_AGENTSCOPE}",
        "agentscope_react_workflow": f"the original's AgentScope ReAct workflow {_AGENTSCOPE}",
        "as_react_workflow": f"the original's AgentScope ReAct workflow {_AGENTSCOPE}",
        "agentscope_react_math_workflow": (
            f"the original's AgentScope ReAct math workflow {_AGENTSCOPE}"
        ),
        "agentscope_reactv2_math_workflow": (
            f"the original's AgentScope ReAct math workflow {_AGENTSCOPE}"
        ),
        "agentscopev0_react_math_workflow": (
            "the original's AgentScope 0.x ReAct math workflow needs the agentscope package "
            "at version 0.x"
        ),
        "agentscope_v1_react_search_workflow": (
            f"the original's AgentScope ReAct search workflow {_AGENTSCOPE} and a web-search "
            "service"
        ),
        "math_rm_workflow": (
            "the original's math workflow for RM-Gallery rewards needs the rm-gallery package "
            "(its rewards score through rm_gallery_reward)"
        ),
        "async_math_rm_workflow": (
            "the original's math workflow for RM-Gallery rewards needs the rm-gallery package "
            "(its rewards score through rm_gallery_reward)"
        ),
        "simple_mm_workflow": (
            "the original's multimodal workflow needs image and video inputs and a "
            "vision-language rollout model, which this project's engines do not take"
        ),
        "async_simple_mm_workflow": (
            "the original's multimodal workflow needs image and video inputs and a "
            "vision-language rollout model, which this project's engines do not take"
        ),
        "bots_ref_eval_collect_math_boxed_workflow": f"the original's BOTS workflow {_EXAMPLE}",
        "examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow": (
            f"the original's BOTS workflow {_EXAMPLE}"
        ),
        "examples.learn_to_ask.workflow.workflow_learn2ask.Learn2AskWorkflow": (
            f"the original's learn-to-ask workflow {_EXAMPLE}"
        ),
        "examples.agentscope_frozenlake.workflow.FrozenLakeWorkflow": (
            f"the original's AgentScope FrozenLake workflow {_EXAMPLE}; it {_AGENTSCOPE} "
            "and gymnasium"
        ),
    },
    "algorithm_type": {
        "multi_step_grpo": (
            "the original's step-wise GRPO trains on every turn of a multi-turn run as its "
            "own experience, each turn given the advantage of the run's last-turn reward "
            "(advantage_fn step_wise_grpo); this project trains a multi-turn run as one "
            "experience: set algorithm_type: grpo (or gigpo for step-level credit)"
        ),
    },
    "reward_functions": {
        "rm_gallery_reward": (
            "the original's RM-Gallery reward needs the rm-gallery package (reward_fn_args."
            "reward_name names one of its rewards); for math answers checked by math-verify "
            "set default_reward_fn_type: math_verify_reward"
        ),
    },
}


def not_here(registry: str, name: str) -> Optional[str]:
    """Why ``name`` of the original's ``registry`` does not run here, or None if it is not
    one of the original's names this project lacks."""
    need = NOT_HERE.get(registry, {}).get(name)
    return None if need is None else f"{need}; not supported yet"
