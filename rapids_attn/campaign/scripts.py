"""A campaign as an array of independent tasks on a batch scheduler: a Slurm array script and a Kubernetes indexed
Job manifest, each task running ``python -m rapids_attn.campaign CAMPAIGN run --index I`` with the scheduler's
index (docs/campaigns.md). The campaign's output folder must be on storage every node sees."""

from __future__ import annotations

import shlex

import yaml

from rapids_attn.campaign.plan import Campaign


def slurm_script(
    c: Campaign, gpus: int = 1, cpus: int = 8, parallel: int | None = None, time_limit: str = "12:00:00"
) -> str:
    n = len(c.runs)
    throttle = f"%{parallel}" if parallel else ""
    campaign = shlex.quote(str(c.path))
    return f"""#!/bin/bash
# {c.spec.name}: {n} runs, one array task each (python -m rapids_attn.campaign {c.path} scripts).
# Submit: sbatch {c.out / "campaign.slurm"}   Status: python -m rapids_attn.campaign {c.path} status
#SBATCH --job-name={shlex.quote(c.spec.name)}
#SBATCH --array=0-{n - 1}{throttle}
#SBATCH --gres=gpu:{gpus}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time_limit}
#SBATCH --output={c.logs_dir}/slurm-%A_%a.log
set -euo pipefail
python -m rapids_attn.campaign {campaign} run --index "$SLURM_ARRAY_TASK_ID"
"""


def k8s_job(
    c: Campaign, image: str, gpus: int = 1, parallel: int | None = None, volume_claim: str = "rapids-attn"
) -> str:
    """An indexed Job: ``completions`` = the runs, each pod's ``JOB_COMPLETION_INDEX`` its run; the campaign file and
    its output folder on a shared volume mounted at the campaign folder's path."""
    n = len(c.runs)
    name = "".join(ch if ch.isalnum() else "-" for ch in c.spec.name.lower()).strip("-")[:50] or "campaign"
    mount = str(c.path.parent)
    command = f'python -m rapids_attn.campaign {shlex.quote(str(c.path))} run --index "$JOB_COMPLETION_INDEX"'
    doc = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"rapids-attn-{name}"},
        "spec": {
            "completions": n,
            "parallelism": parallel or n,
            "completionMode": "Indexed",
            "backoffLimitPerIndex": 1,
            "maxFailedIndexes": n,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "run",
                            "image": image,
                            "command": ["sh", "-c", command],
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                            "volumeMounts": [{"name": "work", "mountPath": mount}],
                        }
                    ],
                    "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": volume_claim}}],
                }
            },
        },
    }
    head = f"# {c.spec.name}: {n} runs as an indexed Job. Apply: kubectl apply -f {c.out / 'campaign-k8s.yaml'}\n"
    return head + yaml.safe_dump(doc, sort_keys=False)
