// What the mixin refuses: a _config that would render an invalid rule, or a rule no one meant. Each refusal is one
// line naming the key and the value, raised when the rules render (jsonnet's `error`), so a typo in an override
// never ships as a rule that is silently never true, or as a page no route expects.
{
  severities:: ['critical', 'warning', 'info'],
  // The types each knob may name: a Freeze has its own alerts (longFreezeSeconds), a Spot eviction pages through
  // pageSpotPreempt, so neither belongs in pageTypes.
  pageTypes:: ['Reboot', 'Redeploy', 'Terminate'],
  warnTypes:: ['Reboot', 'Redeploy', 'Preempt', 'Terminate'],
  sources:: ['Platform', 'User', 'unknown'],

  local fail(key, value, why) = error '_config.%s: %s %s' % [key, std.manifestJsonMinified(value), why],
  local duration(value) = std.isString(value) && std.length(value) > 1
                          && std.member(['s', 'm', 'h', 'd'], value[std.length(value) - 1])
                          && std.all([std.member('0123456789', ch) for ch in std.stringChars(value[:std.length(value) - 1])]),

  local seconds(config, key) =
    local value = config[key];
    if !std.isNumber(value) then fail(key, value, 'is not a number of seconds')
    else if value < 0 then fail(key, value, 'is negative')
    else true,

  local names(config, key, allowed) =
    local value = config[key];
    if !std.isArray(value) then fail(key, value, 'is not a list')
    else
      local unknown = [v for v in value if !std.member(allowed, v)];
      if unknown != [] then fail(key, unknown[0], 'is not one of %s' % std.join(', ', allowed)) else true,

  // The _config keys with a shape a rule depends on; true when they all hold (else the first refusal).
  config(config)::
    std.all([seconds(config, key) for key in ['impactfulPageSeconds', 'longFreezeSeconds', 'hostFailureWatchedSeconds']])
    && names(config, 'pageTypes', $.pageTypes)
    && names(config, 'warnTypes', $.warnTypes)
    && names(config, 'pageSources', $.sources)
    && names(config, 'warnSources', $.sources)
    && (if std.isBoolean(config.pageSpotPreempt) then true else fail('pageSpotPreempt', config.pageSpotPreempt, 'is not true or false'))
    && (if std.isNumber(config.manyVms) && config.manyVms >= 0 && std.floor(config.manyVms) == config.manyVms then true
        else fail('manyVms', config.manyVms, 'is not a whole number of VMs'))
    && (if duration(config.vmInfoLookback) then true else fail('vmInfoLookback', config.vmInfoLookback, 'is not a duration (5m, 1h)')),

  // The alerts with _config.alertOverrides applied: each override names an alert of `rules`, and sets only a known
  // severity and a duration as `for`.
  overridden(config, rules)::
    local overrides = config.alertOverrides;
    local known = [rule.alert for rule in rules];
    local checked = std.all([
      if !std.member(known, name) then fail('alertOverrides', name, 'names no alert of the mixin')
      else
        local o = overrides[name];
        local bad = std.setDiff(std.set(std.objectFields(o)), ['for', 'severity']);
        if bad != [] then fail('alertOverrides.%s' % name, bad[0], 'is not severity or for')
        else if std.objectHas(o, 'severity') && !std.member($.severities, o.severity) then
          fail('alertOverrides.%s.severity' % name, o.severity, 'is not one of %s' % std.join(', ', $.severities))
        else if std.objectHas(o, 'for') && !duration(o['for']) then
          fail('alertOverrides.%s.for' % name, o['for'], 'is not a duration (5m, 1h)')
        else true
      for name in std.objectFields(overrides)
    ]);
    assert checked;
    [
      if std.objectHas(overrides, rule.alert) then
        local o = overrides[rule.alert];
        rule
        + (if std.objectHas(o, 'for') then { 'for': o['for'] } else {})
        + (if std.objectHas(o, 'severity') then { labels+: { severity: o.severity } } else {})
      else rule
      for rule in rules
    ],
}
