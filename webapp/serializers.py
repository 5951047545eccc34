from __future__ import annotations

from rest_framework import serializers

from clockq.jobs.models import Job, JobEvent, Slice


class SliceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Slice
        fields = [
            "id",
            "worker",
            "gpu_index",
            "started_at",
            "ended_at",
            "planned_ms",
            "used_ms",
            "steps",
            "outcome",
            "checkpoint_bytes",
            "checkpoint_ms",
            "restore_ms",
            "gpu_util",
            "plan_reason",
        ]


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason", "actor"]


class JobSerializer(serializers.ModelSerializer):
    tier = serializers.CharField(source="tier.code")
    original_tier = serializers.CharField(source="original_tier.code")
    owner = serializers.CharField(source="owner.username")
    slices = serializers.IntegerField(source="slice_count")

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "state",
            "tier",
            "original_tier",
            "workload",
            "params",
            "deadline",
            "progress",
            "slices",
            "wait_ms",
            "run_ms",
            "checkpoint_generation",
            "failures",
            "last_error",
            "pending_action",
            "worker",
            "submitted_at",
            "first_started_at",
            "finished_at",
            "gpu_mem_mib",
            "placement_note",
            "util_ewma",
            "switch_cost_ms",
        ]
        read_only_fields = fields
