-- Argo CD health check for evalrun.io/EvalRun (resource.customizations.health.evalrun.io_EvalRun).
-- Reads the kstatus conditions the operator writes: Stalled=True is Degraded, Ready=True is Healthy,
-- anything else (including a status for an older generation) is Progressing.
local hs = {status = "Progressing", message = "waiting for the operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
if obj.status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "the operator has not seen this generation yet"
  return hs
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Stalled" and condition.status == "True" then
    hs.status = "Degraded"
    hs.message = condition.message
    return hs
  end
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    hs.message = condition.message
    if condition.status == "True" then
      hs.status = "Healthy"
    end
  end
end
return hs
