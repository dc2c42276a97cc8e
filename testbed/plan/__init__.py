"""Planning: one ``CellPlan`` per cell, computed once, before anything is built."""
from testbed.plan.cellplan import CellPlan, PlanError, crossdc_context, plan_cell, predict
from testbed.plan.sweep import capacity_problems, emulation_problems, plan_all

__all__ = ["CellPlan", "PlanError", "capacity_problems", "crossdc_context",
           "emulation_problems", "plan_all", "plan_cell", "predict"]
